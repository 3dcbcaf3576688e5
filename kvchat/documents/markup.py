"""HTML and XHTML (a web page, an EPUB chapter) to text, within the markup budgets.

inscriptis lays the text out; the tree it reads is parsed here, because libxml2's defaults drop
text without a word: a text node over 10 MB, or everything once elements nest deeper than 256,
leaves an empty result. So the parser lifts libxml2's limits (huge_tree), and kvchat's own limits
are checked instead, each refused in one line that names it: the tags counted before parsing
(a tree of a million elements takes ~270 MB and inscriptis ~12 s), and the depth counted after,
before inscriptis, which recurses once per level.
"""

from __future__ import annotations

import re
from pathlib import Path

import lxml.html
from inscriptis import Inscriptis
from lxml import etree

from kvchat.documents.formats import located
from kvchat.documents.limits import MAX_MARKUP_DEPTH, MAX_MARKUP_TAGS, SPLIT_HINT
from kvchat.errors import DocumentError

XML_DECLARATION = re.compile(r"^<\?xml[^>]*\?>")  # lxml refuses a str that declares its encoding


def markup_text(path: Path, markup: str, part: str = "") -> str:
    """The text of `markup`, the whole of `path` or its `part` (an EPUB's chapter file); DocumentError
    once a limit is exceeded."""
    where = f"{located(path, part)}:"
    if (tags := markup.count("<")) > MAX_MARKUP_TAGS:
        raise DocumentError(f"{where} the markup has {tags:,} tags, over the limit of {MAX_MARKUP_TAGS:,}", SPLIT_HINT)
    markup = XML_DECLARATION.sub("", markup.strip(), count=1)
    if not markup:
        return ""
    parser = lxml.html.HTMLParser(huge_tree=True)
    try:
        tree = lxml.html.document_fromstring(markup, parser=parser)
    except etree.ParserError:  # text without any element: read as preformatted text, as inscriptis does
        tree = lxml.html.document_fromstring(f"<pre>{markup}</pre>", parser=parser)
    if _deeper_than(tree, MAX_MARKUP_DEPTH) or any(error.type_name == "ERR_RESOURCE_LIMIT" for error in parser.error_log):
        raise DocumentError(
            f"{where} elements are nested more than {MAX_MARKUP_DEPTH} deep, the limit (browsers stop there too)",
            "is the file what it claims to be? If it is, save it again from its application, or convert it to PDF",
        )
    return Inscriptis(tree).get_text()


def _deeper_than(tree: lxml.html.HtmlElement, limit: int) -> bool:
    depth = 0
    for event, _element in etree.iterwalk(tree, events=("start", "end")):
        depth += 1 if event == "start" else -1
        if depth > limit:
            return True
    return False
