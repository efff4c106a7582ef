#!/usr/bin/env bash
# The server against the real OpenAI Python client and curl.
# usage: tests/server/run.sh PHASELAB_CLI MODEL.gguf VENV_DIR
# The client is installed from the Python package index into VENV_DIR the
# first time (a pinned version, so that a new release cannot change what is
# tested); without network access that step fails, and so does the test.
set -euo pipefail
CLI="$1" MODEL="$2" VENV="$3"
OPENAI_VERSION="3.57.0"
if ! "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "test_server_openai: installing openai==$OPENAI_VERSION into $VENV" >&2
  python3 -m venv "$VENV" || { echo "python3 -m venv failed: scripts/install-deps.sh installs python3-venv" >&2; exit 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "openai==$OPENAI_VERSION"
fi
command -v curl >/dev/null || { echo "curl is missing: scripts/install-deps.sh installs it" >&2; exit 1; }
exec "$VENV/bin/python" "$(dirname "$0")/test_openai_client.py" "$CLI" "$MODEL"
