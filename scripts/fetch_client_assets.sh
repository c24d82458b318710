#!/usr/bin/env bash
# Fetches the OpenAI Python client, the reference client the server's tests speak through, into
# a cache outside the repository (nothing of it is committed), and prints the cache's path:
#   $ASYNCT_CACHE (default ~/.cache/asynct)/python-openai/   openai and its dependencies,
#                                                            each at a pinned version
# Safe to run repeatedly: what is there and imports at those versions is kept.
set -euo pipefail
cache="${ASYNCT_CACHE:-$HOME/.cache/asynct}"
target="$cache/python-openai"
pins=(openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 idna==3.20
      truststore==0.10.5 jiter==0.19.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0
      typing_extensions==4.16.0 typing_inspection==0.4.5)
if ! PYTHONPATH="$target" python3 -c "import openai, sys; sys.exit(openai.__version__ != '3.57.0')" 2>/dev/null; then
  echo "installing the OpenAI Python client 3.57.0 into $target" >&2
  rm -rf "$target"
  python3 -m pip install -q --root-user-action=ignore --no-deps --target "$target" "${pins[@]}" >&2
  PYTHONPATH="$target" python3 -c "import openai" || { echo "fetch_client_assets: openai does not import from $target" >&2; exit 1; }
fi
echo "$cache"
