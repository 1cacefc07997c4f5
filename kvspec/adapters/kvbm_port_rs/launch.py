"""Start the Rust port: build it with rustc on first use (cached), then become it.

The port has no crates (standard library only), so one ``rustc`` call builds
it; no cargo registry is needed. The binary is cached outside the source tree,
keyed by a hash of the sources and the compiler's version, in
``$KVSPEC_BUILD_DIR`` or else a per-user folder of the temp directory. A lock
file makes concurrent starts build once. Build errors go to stderr (the suite
shows the child's stderr when the adapter fails) and exit with status 3.

``python -m kvspec.adapters.kvbm_port_rs.launch [--variant NAME]``: NAME is one
of the port's single-bug variants (manifest.toml); without it, the clean port.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "src").glob("*.rs"))
RUSTC_FLAGS = ["-O", "--edition", "2021", "-C", "debuginfo=0", "--cap-lints", "warn"]


def find_rustc() -> str | None:
    """$RUSTC, else rustc on PATH, else the rustup default location."""
    for name in (os.environ.get("RUSTC"), "rustc", str(Path.home() / ".cargo" / "bin" / "rustc")):
        if name:
            path = shutil.which(name)
            if path:
                return path
    return None


def build_dir() -> Path:
    env = os.environ.get("KVSPEC_BUILD_DIR")
    d = Path(env) if env else Path(tempfile.gettempdir()) / f"kvspec-build-{os.getuid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def build(rustc: str) -> Path:
    """The cached binary for these sources and this compiler, built if missing."""
    version = subprocess.run([rustc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(version.encode() + repr(RUSTC_FLAGS).encode())
    for src in SOURCES:
        key.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    out_dir = build_dir()
    binary = out_dir / f"kvbm_port_rs-{key.hexdigest()[:20]}"
    if binary.is_file():
        return binary
    with open(out_dir / "kvbm_port_rs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        tmp = out_dir / f".{binary.name}.{os.getpid()}.tmp"
        cmd = [rustc, *RUSTC_FLAGS, str(HERE / "src" / "main.rs"), "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            sys.stderr.write(f"kvbm_port_rs: building failed:\n$ {' '.join(cmd)}\n{proc.stderr}\n")
            sys.exit(3)
        os.replace(tmp, binary)
    return binary


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    rustc = find_rustc()
    if rustc is None:
        sys.stderr.write("kvbm_port_rs: no rustc found ($RUSTC, PATH, ~/.cargo/bin); the port is built from source\n")
        sys.exit(3)
    binary = build(rustc)
    sys.stderr.flush()
    os.execv(binary, [str(binary), *args])


if __name__ == "__main__":
    main()
