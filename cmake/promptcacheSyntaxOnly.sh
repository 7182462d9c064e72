#!/bin/sh
# A compiler launcher (CXX_COMPILER_LAUNCHER) that promptcache_syntax_only_objects sets
# under PROMPTCACHE_SYNTAX_ONLY_PROGRAMS: runs the compile command it is given with
# -fsyntax-only (the compiler's diagnostics, its dependency file, no code) and, if it
# succeeds, writes an empty file at the object path the command names (-o <path>).
out=
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out=$arg; fi
  prev=$arg
done
"$@" -fsyntax-only || exit
if [ -n "$out" ]; then : >"$out"; fi
