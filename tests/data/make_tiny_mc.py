"""Generates tests/data/tiny_mc.jsonl: a multiple-choice task for the 64-token
test vocabulary of tests/python/test_cli.py, whose training stream follows the
rule next = (t * 7 + 3) % 62 + 2 most of the time.  Each example gives a
context that follows the rule and four continuations: the rule's (the label)
and three of random tokens.  Half the examples have choices of equal length,
half of different lengths (so acc and acc_per_token can differ).

    python tests/data/make_tiny_mc.py > tests/data/tiny_mc.jsonl
"""
import json
import random


def follow(t, n):
    out = []
    for _ in range(n):
        t = (t * 7 + 3) % 62 + 2
        out.append(t)
    return out


def main():
    rng = random.Random(1)
    for i in range(40):
        start = rng.randrange(2, 64)
        context = [start] + follow(start, rng.randrange(4, 12))
        n = rng.randrange(1, 4)
        correct = follow(context[-1], n)
        choices = []
        for _ in range(3):
            length = n if i % 2 == 0 else rng.randrange(1, 5)
            choices.append([rng.randrange(2, 64) for _ in range(length)])
        label = rng.randrange(4)
        choices.insert(label, correct)
        print(json.dumps({"context": context, "choices": choices, "label": label}))


if __name__ == "__main__":
    main()
