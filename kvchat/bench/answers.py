"""Does a generated answer give the gold answer? A normalized match for questions about real documents.

A gold is one of three kinds, told apart by what it holds:
- a date ("March 28, 2019"): matched as a calendar date, whatever its format ("28 March 2019",
  "2019-03-28", "3/28/2019", "3/28/19", "28th day of March, 2019");
- a quantity, a number with a unit ("sixty (60) days", "12-month", "$5,000", "3%"): numbers in
  words or digits are the same number, units match in singular or plural;
- otherwise text (a name, a place, a title): its distinctive words, in order and on word
  boundaries, case, punctuation and spacing ignored ("Care G. B. Plus Ltd." is found in "Care
  G.B. Plus"; a trailing "Ltd.", "Inc." ... and a leading "the" are not required).

An answer is right when it mentions one of the golds (they are alternatives), mentions none of the
`refuse` strings (the other party, say), and gives no other value of the gold's kind: a date
that is no gold's, or a quantity in a gold's unit that is no gold's. So "60 days" is right and
"30, 60 or 180 days" is not.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import date

_UNITS = {"day": "day", "week": "week", "month": "month", "year": "year", "percent": "percent",
          "dollar": "dollar", "usd": "dollar"}
_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_NUMBER_WORDS = {word: value for value, word in enumerate(_ONES)} | {
    word: 20 + 10 * index for index, word in enumerate(_TENS)}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 1_000_000}
_NUMBER_WORD = "|".join(sorted([*_NUMBER_WORDS, *_SCALES], key=len, reverse=True))
_AFTER_SCALE = "(?:(?<=hundred)|(?<=thousand)|(?<=million))"  # "one hundred and five", never "one and two"
_NUMBER_RUN = re.compile(rf"\b(?:{_NUMBER_WORD})(?:(?:{_AFTER_SCALE}\s+and\s+|[\s-]+)(?:{_NUMBER_WORD}))*\b")
_REPEATED = re.compile(r"(\d+(?:\.\d+)?)\s*\(\s*\1\s*\)")  # "5 (5)": the words, then the digits
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)\s*-?\s*(?:(?:calendar|business|working)\s+)?"
                       rf"({'|'.join(_UNITS)})s?\b")

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTH = r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?" \
         r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_ORDINAL = r"(?:\s*(?:st|nd|rd|th|t\s?h))?"  # "20t h" as the Todos contract's text has it
_YEAR = r"(\d{4}|'?\d{2})\b"
_DATES = (
    ("ymd", re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")),
    ("numeric", re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b")),
    ("numeric", re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b")),  # a 4-digit year, unlike "Section 15.2.10"
    ("mdy", re.compile(rf"\b{_MONTH}\s+(\d{{1,2}}){_ORDINAL},?\s+{_YEAR}")),
    ("dmy", re.compile(rf"\b(\d{{1,2}}){_ORDINAL}\s+(?:day\s+of\s+)?{_MONTH},?\s+{_YEAR}")),
)
_LEGAL_SUFFIXES = {"ltd", "inc", "llc", "lp", "plc", "corp", "corporation", "co", "company", "limited", "gmbh",
                   "sa", "ag", "nv", "bv"}


def _folded(text: str) -> str:
    """Lower case, compatibility forms and accents folded, curly quotes and dashes made plain."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    return text.translate(str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"',
                                         "\u2013": "-", "\u2014": "-", "\u00a0": " "}))


def _number_value(words: str) -> int:
    """The value of a run of number words ("one hundred eighty", "twenty-four", "five thousand")."""
    total, current = 0, 0
    for word in re.findall(r"[a-z]+", words):
        if word in _NUMBER_WORDS:
            current += _NUMBER_WORDS[word]
        elif word in _SCALES:
            current = max(current, 1) * _SCALES[word]
            if _SCALES[word] >= 1000:
                total, current = total + current, 0
    return total + current


def normalized(text: str) -> str:
    """Folded text with numbers as plain digits: number words become digits, "sixty (60)" becomes
    "60", "$5,000.00" becomes "5000 dollar", "3%" becomes "3 percent"."""
    text = _folded(text)
    text = _NUMBER_RUN.sub(lambda match: str(_number_value(match.group())), text)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"(\d+)\.0+\b", r"\1", text)
    text = re.sub(r"\$\s*(\d+(?:\.\d+)?)", r"\1 dollar", text)
    text = re.sub(r"(\d+(?:\.\d+)?)\s*%", r"\1 percent", text)
    return _REPEATED.sub(r"\1", text)


def _year(text: str) -> int:
    value = int(text.lstrip("'"))
    if len(text.lstrip("'")) == 4:
        return value
    return value + (1900 if value >= 50 else 2000)


def _date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def dates_in(text: str) -> set[date]:
    """Every calendar date the text writes, in any of the formats above (numeric ones month first,
    as in US contracts, unless the first number cannot be a month)."""
    text = _folded(text)
    found: set[date | None] = set()
    for form, pattern in _DATES:
        for match in pattern.finditer(text):
            groups = match.groups()
            if form == "ymd":
                found.add(_date(int(groups[0]), int(groups[1]), int(groups[2])))
            elif form == "numeric":
                first, second = int(groups[0]), int(groups[1])
                month, day = (second, first) if first > 12 else (first, second)
                found.add(_date(_year(groups[2]), month, day))
            elif form == "mdy":
                found.add(_date(_year(groups[2]), _MONTHS.index(groups[0][:3]) + 1, int(groups[1])))
            else:
                found.add(_date(_year(groups[2]), _MONTHS.index(groups[1][:3]) + 1, int(groups[0])))
    return {each for each in found if each is not None}


def quantities_in(text: str) -> set[tuple[float, str]]:
    """Every (number, unit) the text states, units singular: {(60.0, "day")} for "sixty (60) days"."""
    return {(float(number), _UNITS[unit]) for number, unit in _QUANTITY.findall(normalized(text))}


def _joined(text: str) -> tuple[str, set[int], set[int]]:
    """The text's alphanumeric words run together, with the offsets where words start and end,
    so that "G. B.", "G.B." and "GB" (or "bw-3" and "BW3") are the same letters."""
    words = re.findall(r"[a-z0-9]+", normalized(text))
    starts, ends, offset = set(), set(), 0
    for word in words:
        starts.add(offset)
        offset += len(word)
        ends.add(offset)
    return "".join(words), starts, ends


def _distinctive(text: str) -> str:
    """A name's words without a leading "the" and trailing legal forms ("Ltd.", "Inc.", ...)."""
    words = re.findall(r"[a-z0-9]+", normalized(text))
    while words and words[0] == "the":
        words.pop(0)
    while len(words) > 1 and words[-1] in _LEGAL_SUFFIXES:
        words.pop()
    return "".join(words)


def _mentions_text(text: str, gold: str) -> bool:
    wanted = _distinctive(gold)
    joined, starts, ends = _joined(text)
    at = joined.find(wanted)
    while wanted and at >= 0:
        if at in starts and at + len(wanted) in ends:
            return True
        at = joined.find(wanted, at + 1)
    return False


def mentions(text: str, gold: str) -> bool:
    """Whether the text states the gold: the same date, the same quantity, or the gold's words."""
    gold_dates = dates_in(gold)
    if gold_dates:
        return bool(gold_dates & dates_in(text))
    gold_quantities = quantities_in(gold)
    if gold_quantities:
        return bool(gold_quantities & quantities_in(text))
    return _mentions_text(text, gold)


def _other_values(answer: str, golds: tuple[str, ...]) -> bool:
    """Whether the answer gives a date, or a quantity in a gold's unit, that no gold gives."""
    gold_dates = set().union(*(dates_in(gold) for gold in golds))
    if gold_dates and dates_in(answer) - gold_dates:
        return True
    gold_quantities = set().union(*(quantities_in(gold) for gold in golds))
    units = {unit for _, unit in gold_quantities}
    return any(unit in units for _, unit in quantities_in(answer) - gold_quantities)


def answer_matches(answer: str, golds: tuple[str, ...], refuse: tuple[str, ...] = ()) -> bool:
    """Whether the answer gives one of the golds, none of `refuse`, and no competing value."""
    if not any(mentions(answer, gold) for gold in golds):
        return False
    if any(mentions(answer, wrong) for wrong in refuse):
        return False
    return not _other_values(answer, golds)
