"""One normalization for the text of every format, so the model reads text as it was trained on.

PDF extractors hand back words joined by no-break spaces (U+00A0), which the tokenizer splits into
tokens of their own: a contract can cost 1.8x its plain text's tokens. Each page is normalized on
its own before pages are laid end to end, so page ranges and character offsets point at the text
the model reads.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

# Compatibility mappings that change what the text says: x² -> x2, 1½ -> 11⁄2, 1º -> 1o, H₂O -> H2O.
MEANINGFUL_TAGS = frozenset({"<super>", "<sub>", "<fraction>"})
# Kinds of hyphen the tokenizer does not know as "-"; NFKC turns U+2011 into U+2010, not "-".
HYPHENS = {0x2010: "-", 0x2011: "-"}
# Invisible characters that only say where a line may break: soft hyphen, zero-width space, word
# joiner, a byte order mark inside the text. Joiners (U+200C, U+200D) shape scripts and emoji: kept.
INVISIBLE = {0x00AD: None, 0x200B: None, 0x2060: None, 0xFEFF: None}
SOFT_HYPHEN_LINE_END = re.compile(r"\u00ad[^\S\n]*\n[^\S\n]*")
SPACES = re.compile(r"[^\S\n\t]")  # any whitespace but a newline or a tab (tabs lay out columns)
INNER_SPACES = re.compile(r"(?<=\S) {2,}")
INDENTATION = re.compile(r"^ +", re.MULTILINE)
BLANK_LINES = re.compile(r"\n{3,}")
# A hyphen that ends a line between two words' letters: "non-\nexclusive", "inter-\nnational".
# Matches start at a word's start only, so a long word is scanned once, not from each of its letters.
LINE_END_HYPHEN = re.compile(r"(?<![^\W\d_])([^\W\d_]+)-\n *([^\W\d_]+)")
WORD = re.compile(r"[^\W\d_]+")
# Each hyphenated pair of a compound: "product-by-product" gives "product-by" and "by-product".
HYPHENATED_PAIR = re.compile(r"(?<![^\W\d_])(?=([^\W\d_]+-[^\W\d_]+))")


@lru_cache(maxsize=4096)
def _compatible(char: str) -> str:
    """NFKC of one character, unless that changes its meaning (MEANINGFUL_TAGS) or turns a
    spacing accent (´ ¨ ˜, drawn apart from their letter in some PDFs) into a space and a
    combining mark that joins nothing."""
    decomposition = unicodedata.decomposition(char)
    if decomposition.split(" ", 1)[0] in MEANINGFUL_TAGS or decomposition.startswith("<compat> 0020 "):
        return char
    return unicodedata.normalize("NFKC", char)


def _nfkc(text: str) -> str:
    """NFKC where it keeps the meaning: per character (see _compatible), then NFC over the whole,
    which composes what NFKC would have composed (letters and their combining marks)."""
    if unicodedata.is_normalized("NFKC", text):
        return text
    table = {ord(char): _compatible(char) for char in set(text) if not unicodedata.is_normalized("NFKC", char)}
    return unicodedata.normalize("NFC", text.translate(table))


def _clean(text: str, keep_indentation: bool) -> str:
    """Lines, characters and spaces: everything but the line-end hyphens, which need the vocabulary."""
    text = "\n".join(text.splitlines())  # \r\n, \r, U+2028, form feeds... all become "\n"
    text = SOFT_HYPHEN_LINE_END.sub("", _nfkc(text)).translate(HYPHENS | INVISIBLE)
    text = INNER_SPACES.sub(" ", SPACES.sub(" ", text))
    if not keep_indentation:
        text = INDENTATION.sub("", text)
    return "\n".join(line.rstrip() for line in text.split("\n"))


def _vocabulary(texts: Sequence[str]) -> frozenset[str]:
    """Every word and hyphenated pair of words in the document, lowercased."""
    text = "\n".join(texts).lower()
    return frozenset(WORD.findall(text)) | frozenset(HYPHENATED_PAIR.findall(text))


def _join_hyphenated(text: str, vocabulary: frozenset[str]) -> str:
    """Rejoin a word that a line end broke after a hyphen. The document decides whether the hyphen
    stays: dropped when the closed word occurs in it and the hyphenated one does not
    ("inter-\\nnational"), kept otherwise ("non-\\nexclusive", "royalty-\\nfree") and always
    within a longer compound ("product-by-\\nproduct"). The word after must start with a small
    letter: a capital starts a heading or a name."""

    def join(match: re.Match[str]) -> str:
        before, after = match.groups()
        if not after[0].islower():
            return match.group(0)
        hyphenated = f"{before}-{after}"
        in_compound = text[match.start() - 1 : match.start()] == "-"
        if not in_compound and (before + after).lower() in vocabulary and hyphenated.lower() not in vocabulary:
            return before + after
        return hyphenated

    return LINE_END_HYPHEN.sub(join, text)


def normalize_pages(texts: Sequence[str], keep_indentation: bool = True) -> list[str]:
    """Each page's text normalized: compatibility characters by NFKC where that keeps the meaning,
    space-like characters as a plain space and runs of them inside a line as one, trailing spaces
    dropped, soft hyphens removed, words broken at a line end rejoined, runs of blank lines as one
    blank line, and no whitespace at either end. Single newlines stay: they end clauses and list
    items. Spaces that start a line stay with `keep_indentation` (code and nested lists in text
    and Markdown need them); a PDF's are where the layout put the line, and cost tokens."""
    cleaned = [_clean(text, keep_indentation) for text in texts]
    vocabulary = _vocabulary(cleaned)
    return [BLANK_LINES.sub("\n\n", _join_hyphenated(text, vocabulary)).strip() for text in cleaned]
