#ifndef OLMOC_COMMANDS_H
#define OLMOC_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);

#endif
