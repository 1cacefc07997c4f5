"""Build and start a Rust port: ``python -m kvspec.adapters.rust_launch ADAPTER_DIR [ARGS...]``.

The allocator ports (``adapters/paged_rust``, ``adapters/session_rust``) are
Rust programs (standard library only: ``main.rs``, the modules beside it, plus
the shared JSON reader ``adapters/rust_common/json.rs``) built from source when the suite starts
them: ``rustc`` compiles ``ADAPTER_DIR/main.rs`` into the build cache (the
same folder C ports use, keyed by the sources and the compiler's version),
and this process then becomes the port (``exec``), so the suite talks to the
Rust program itself. Without ``rustc``, or when it fails, the launcher answers
the suite's ``hello`` with ``refused`` carrying the reason, so the run fails
with that message instead of a bare exit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvspec.api import build_dir

COMMON = Path(__file__).resolve().parent / "rust_common"


def _refuse(message: str) -> int:
    sys.stdin.readline()  # the hello
    print(json.dumps({"type": "refused", "error": {"code": "internal_error", "message": message[-60000:]}}), flush=True)
    return 1


def build(adapter_dir: Path) -> Path:
    """The port's binary, compiled if the cache has none for these sources."""
    rustc = shutil.which("rustc")
    if rustc is None:
        raise RuntimeError("rustc not found on PATH: the Rust ports are built from source at start")
    version = subprocess.run([rustc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(version.encode())
    # every .rs beside main.rs (its modules) and the shared ones are part of the key
    sources = [*sorted(adapter_dir.glob("*.rs")), *sorted(COMMON.glob("*.rs"))]
    for f in sources:
        key.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    out = build_dir() / f"{adapter_dir.name}-{key.hexdigest()[:20]}"
    if out.is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cmd = [rustc, "--edition", "2021", "-C", "opt-level=1", "-o", str(tmp), str(adapter_dir / "main.rs")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"rustc failed building {adapter_dir / 'main.rs'}:\n{proc.stderr}")
    os.replace(tmp, out)  # atomic: a concurrent start sees the whole binary or none
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m kvspec.adapters.rust_launch ADAPTER_DIR [ARGS...]", file=sys.stderr)
        return 2
    try:
        binary = build(Path(args[0]).resolve())
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return _refuse(str(e))
    os.execv(binary, [str(binary), *args[1:]])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
