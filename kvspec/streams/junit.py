"""JUnit XML of a stream check, for CI systems that show test reports.

One ``testsuite`` named after the tool; one ``testcase`` per stream-checkable
rule the checker ran (``classname`` = the input's format, ``name`` = the rule
id), failed when the stream broke it (the message says how often, the body
lists the first findings), skipped when the user ignored it; plus one
``input`` testcase that errors when the input could not be read.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def junit_xml(
    *,
    tool: str,
    fmt: str,
    rules: Iterable[str],
    findings_by_rule: Mapping[str, int],
    ignored: Iterable[str],
    findings: Sequence[Mapping[str, Any]],
    error: str | None,
    seconds: float,
) -> bytes:
    ignored = set(ignored)
    rules = sorted(set(rules) | set(findings_by_rule))
    suite = ET.Element("testsuite", name=tool, time=f"{seconds:.3f}")
    n_fail = n_skip = 0
    case = ET.SubElement(suite, "testcase", classname=fmt, name="input")
    if error is not None:
        ET.SubElement(case, "error", message=error).text = error
    for rid in rules:
        case = ET.SubElement(suite, "testcase", classname=fmt, name=rid)
        if rid in ignored:
            ET.SubElement(case, "skipped", message="ignored on the command line")
            n_skip += 1
            continue
        n = findings_by_rule.get(rid, 0)
        if n:
            n_fail += 1
            body = "\n".join(f"{f['at']}: {f['message']}" for f in findings if f["rule"] == rid)
            ET.SubElement(case, "failure", message=f"{rid} broken {n} time(s)", type=rid).text = body
    suite.set("tests", str(len(rules) + 1))
    suite.set("failures", str(n_fail))
    suite.set("errors", "1" if error is not None else "0")
    suite.set("skipped", str(n_skip))
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))


def write_junit(data: bytes, dest: str) -> None:
    if dest == "-":
        import sys

        sys.stdout.write(data.decode("utf-8") + "\n")
    else:
        Path(dest).write_bytes(data)
