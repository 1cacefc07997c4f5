"""MkDocs hook: heading anchors as GitHub makes them.

The spec documents (kvspec/spec/*.md, shown under docs/spec/) are read on
GitHub too, and link to their own sections with GitHub's anchors
(``#counters--the-counters-add-up-to-the-capacity``: the em dash removed, the
two spaces around it kept as two hyphens). Python-Markdown's default slug
collapses them to one, so the same link would be broken on one of the two.
This hook gives the site GitHub's slugs, and ``validation.anchors`` in
mkdocs.yml then checks every such link at build time.
"""

from __future__ import annotations

import re
from typing import Any

_DROP = re.compile(r"[^\w\- ]", re.UNICODE)


def github_slug(value: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen."""
    return _DROP.sub("", value.strip().lower()).replace(" ", separator)


def on_config(config: Any) -> Any:
    config["mdx_configs"].setdefault("toc", {})["slugify"] = github_slug
    return config
