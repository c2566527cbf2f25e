#ifndef OLMOC_COMMANDS_H
#define OLMOC_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

#endif
