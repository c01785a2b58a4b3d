#!/usr/bin/python3
"""clang-tidy over the given files, with a cache of clean results.

Usage: tidy.py BUILD_DIR FILE...

Each file is checked with `clang-tidy -p BUILD_DIR --quiet`. A file that comes
out clean is remembered under a key made of everything its result depends on:
the clang-tidy version, the repository's .clang-tidy, the file's compile
command and its preprocessed text with comments kept (so headers, macros and
NOLINT comments all count). The repository root is replaced by a placeholder
in the key, so another clone of the same tree (CI's clean clone) hits the same
entries. Only clean results are cached: a file with findings is re-checked
every time and its findings are printed.

The cache lives in $OMNI_TIDY_CACHE, else $XDG_CACHE_HOME/omni-clang-tidy,
else ~/.cache/omni-clang-tidy. OMNI_TIDY_CACHE=off disables it.
Exit status: 0 when every file is clean, 1 otherwise.
"""
import concurrent.futures
import hashlib
import json
import os
import shlex
import subprocess
import sys


def cache_dir():
    explicit = os.environ.get("OMNI_TIDY_CACHE")
    if explicit == "off":
        return None
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return os.path.join(base, "omni-clang-tidy")


def preprocess_command(entry):
    """The compile command with -o/-c replaced by -E -C (keep comments)."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("-o", "-c"):
            skip = arg == "-o"
            continue
        out.append(arg)
    return out[:-1] + ["-E", "-C", out[-1]] if out else out


def key_for(path, entry, root, salt):
    h = hashlib.sha256(salt)
    h.update(entry["command"].replace(root, "<root>").encode()
             if "command" in entry else
             " ".join(entry["arguments"]).replace(root, "<root>").encode())
    pre = subprocess.run(preprocess_command(entry), cwd=entry["directory"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         check=False)
    if pre.returncode != 0:
        return None  # let clang-tidy report whatever is wrong
    h.update(pre.stdout.replace(root.encode(), b"<root>"))
    return h.hexdigest()


def check(path, build, entries, root, salt, cache):
    absolute = os.path.abspath(path)
    entry = entries.get(absolute)
    key = key_for(path, entry, root, salt) if (cache and entry) else None
    if key and os.path.exists(os.path.join(cache, key)):
        return path, True, "", True
    run = subprocess.run(["clang-tidy", "-p", build, "--quiet", path],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, check=False)
    text = "\n".join(line for line in run.stdout.splitlines()
                     if "warnings generated" not in line)
    clean = run.returncode == 0 and ("warning:" not in text and
                                     "error:" not in text)
    if clean and key:
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, key), "w", encoding="utf-8") as f:
            f.write(path + "\n")
    return path, clean, text, False


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: tidy.py BUILD_DIR FILE...")
    build, files = sys.argv[1], sys.argv[2:]
    root = os.path.abspath(os.getcwd())
    with open(os.path.join(build, "compile_commands.json"),
              encoding="utf-8") as f:
        entries = {os.path.abspath(os.path.join(e["directory"], e["file"])): e
                   for e in json.load(f)}
    version = subprocess.run(["clang-tidy", "--version"], stdout=subprocess.PIPE,
                             check=True).stdout
    with open(os.path.join(root, ".clang-tidy"), "rb") as f:
        salt = version + f.read()
    cache = cache_dir()
    failed = hits = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        jobs = [pool.submit(check, p, build, entries, root, salt, cache)
                for p in files]
        for job in concurrent.futures.as_completed(jobs):
            path, clean, text, hit = job.result()
            hits += hit
            if text.strip():
                print(text, flush=True)
            if not clean:
                failed += 1
                print(f"lint: clang-tidy findings in {path}", flush=True)
    print(f"lint: clang-tidy {len(files)} files, {hits} clean in the cache "
          f"({cache or 'cache off'}), {failed} with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
