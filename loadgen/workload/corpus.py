"""Token-level text source: words that each cost one token in the middle of a text, per tokenizer.

Prompt text is a sequence of such words, so a budget is met by choosing how many words to take; tokens can
still merge across word boundaries, which is why budget.py measures the real count and adjusts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Common English words (public domain frequency lists); most are one token in any large vocabulary.
_WORDS_TEXT = """
the of and to in is was for that with as on by at from his her this which or an be are it had not but
were have one all their they been has more when who will there would can no if out so said what up its
about into than them only other new some could time these two may then do first any my now such like our
over man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see men work
long get here between both life being under never day same another know while last might us great old year
off come since against go came right used take three states himself few house use during without again
place around however home small found thought went say part once general high upon school every does got
united left number course war until always away something fact though water less public put think almost
hand enough far took head yet government system better set told nothing night end why called did find
going look asked later point knew city next program business give group toward young days let room
president side social given present several order national possible rather second face per among form
important often things looked early white case john become large big need four within felt along children
saw best church ever least power development light thing seemed family interest want members others mind
country area done turned although open god service certain kind problem began different door thus help
sense means whole matter perhaps itself york times law human line above name example action company hands
local show five history whether gave either today act feel across taken past quite anything seen having
death experience body word half really week car field money words already information tell together college
shall sort themselves reason form friend river garden window letter market music paper story study summer
table winter animal answer circle island middle minute morning plant season single spring stone village
"""
WORDS = _WORDS_TEXT.split()
# Short, common pieces to close the last one or two tokens of a budget when a whole word lands off by one.
_FILLERS_TEXT = "a I o x y z s t e n 1 2 3 , . ; : - ! ? ok no go up on in at to it is be"
FILLERS = _FILLERS_TEXT.split()


@dataclass(frozen=True)
class Corpus:
    """Per-tokenizer word pool: words adding exactly one token after a space, and one-token fillers."""

    words: tuple[str, ...]
    fillers: tuple[str, ...]
    running_text: bool = False  # a user's corpus: spans of its text, in order, rather than random words

    def sample(self, rng: random.Random, n: int) -> list[str]:
        if not self.running_text:
            return rng.choices(self.words, k=n)
        start = rng.randrange(len(self.words))
        return [self.words[(start + i) % len(self.words)] for i in range(n)]


def _adds_one(tok: Any, candidates: list[str]) -> list[str]:
    # Measured after a leading word so SentencePiece's start-of-text space handling does not count.
    base = len(tok("the", add_special_tokens=False)["input_ids"])
    encoded = tok([f"the {w}" for w in candidates], add_special_tokens=False)["input_ids"]
    return [w for w, ids in zip(candidates, encoded, strict=True) if len(ids) == base + 1]


def build_corpus(tok: Any) -> Corpus:
    """Filter the word list down to one-token words for this tokenizer (a few ms, done once per run)."""
    words = _adds_one(tok, list(dict.fromkeys(WORDS)))
    fillers = _adds_one(tok, FILLERS)
    if len(words) < 8:  # a tiny vocabulary: fall back to whatever costs one token, even single letters
        words = list(dict.fromkeys(words + fillers))
    if not words:
        raise ValueError("no one-token words for this tokenizer; cannot budget prompt text")
    return Corpus(words=tuple(words), fillers=tuple(fillers or words))


def text_corpus(tok: Any, path: Path) -> Corpus:
    """`--corpus FILE`: real text. Prompts take runs of its words (whitespace-separated) from a random
    start; words cost what they cost (the budget measures), and one-token fillers still close the last gap."""
    words = path.read_text(encoding="utf-8").split()
    if not words:
        raise ValueError(f"--corpus {path}: no words in the file")
    fillers = _adds_one(tok, FILLERS) or _adds_one(tok, list(dict.fromkeys(WORDS)))
    return Corpus(words=tuple(words), fillers=tuple(fillers or words[:8]), running_text=True)
