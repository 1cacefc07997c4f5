"""The z3 encodings of the block-level profiles, by profile name.

Kept apart from the CLI (``smt/cli/profiles.py``) so that the agreement,
equivalence and reach modules of this package can look an encoding up without
importing the command that drives them.
"""

from __future__ import annotations

from kvspec.reference.smt.blocks.encoding import ProfileEncoding


def block_encoding(profile: str) -> ProfileEncoding:
    """The encoding of the block-level profile ``profile`` (kvbm, atomic or legacy)."""
    from kvspec.reference.smt.blocks import atomic, kvbm, legacy

    return {m.PROFILE.name: m.PROFILE for m in (kvbm, atomic, legacy)}[profile]
