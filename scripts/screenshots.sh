#!/usr/bin/env bash
# Screenshots of the real window, as a person sees it: PhaseLab in an X
# server (Xvfb) at 1280x800 and 800x600, driven with xdotool (type a
# question, Ctrl+Enter), captured mid-answer and after. Writes
# docs/screenshots/{chat,notebook}-<size>-{mid,after}.png and
# phase-meter-<size>.png (the metrics dock's second tab),
# batch-sweep-<size>.png (the Compare window's batch sweep at 1,2,4,8),
# settings-servers-<size>.png (Settings > Servers while the window serves its
# model; the chat shots show "Serving at ..." in the status bar),
# remote-<size>-{mid,after}.png and remote-phase-meter-<size>.png (the chat
# through a remote server: phaselab-cli serve, started here) and
# docs/screenshot.png (the README's, 1280x800 after the answer), and
# issue-36/get-models-<size>-{search,downloading,done}.png (File > Get
# Models… on the tests' stand-in for Hugging Face, phaselab-fake-hub, with a
# slow CDN: a search with a repository's files, a download mid-way, done).
#
#   scripts/screenshots.sh [MODEL.gguf]     (default: the default model)
#   scripts/screenshots.sh --get-models     (only the Get Models shots: no model needed)
#
# Needs a build (scripts/build.sh) and xvfb, xdotool and imagemagick
# (scripts/install-deps.sh installs them). Settings and conversations go to a
# temporary folder: yours are not touched.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ONLY_GET_MODELS=0
if [[ "${1:-}" == "--get-models" ]]; then ONLY_GET_MODELS=1; shift; fi
MODEL=${1:-${PHASELAB_MODEL:-$HOME/.local/share/PhaseLab/models/gemma-3-270m-q4_k_m.gguf}}
APP=${PHASELAB_GUI:-$ROOT/build/app/gui/phaselab}
OUT=${PHASELAB_SCREENSHOTS:-$ROOT/docs/screenshots}
for tool in Xvfb xdotool import; do
  command -v "$tool" >/dev/null || { echo "screenshots: $tool is missing: run scripts/install-deps.sh" >&2; exit 1; }
done
[[ -x "$APP" ]] || { echo "screenshots: $APP is missing: run scripts/build.sh" >&2; exit 1; }
[[ $ONLY_GET_MODELS == 1 || -f "$MODEL" ]] || { echo "screenshots: no model at $MODEL: run scripts/fetch-model.sh" >&2; exit 1; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
CLI=${PHASELAB_CLI:-$ROOT/build/app/phaselab-cli}
[[ $ONLY_GET_MODELS == 1 || -x "$CLI" ]] || { echo "screenshots: $CLI is missing: run scripts/build.sh" >&2; exit 1; }
FAKE_HUB=${PHASELAB_FAKE_HUB:-$ROOT/build/tests/phaselab-fake-hub}
[[ -x "$FAKE_HUB" ]] || { echo "screenshots: $FAKE_HUB is missing: cmake --build build --target phaselab-fake-hub" >&2; exit 1; }
XPID=""; APID=""; SPID=""; HPID=""
cleanup() {
  [[ -n "$APID" ]] && kill "$APID" 2>/dev/null || true
  [[ -n "$SPID" ]] && kill "$SPID" 2>/dev/null || true
  [[ -n "$HPID" ]] && kill "$HPID" 2>/dev/null || true
  [[ -n "$XPID" ]] && kill "$XPID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# quit_app: Ctrl+Q, and the process ended if it has not quit in 10 s.
quit_app() {
  xdotool key ctrl+q
  for _ in $(seq 100); do kill -0 "$APID" 2>/dev/null || break; sleep 0.1; done
  kill "$APID" 2>/dev/null || true
  wait "$APID" 2>/dev/null || true; APID=""
}

# start_x SIZE: an X server of that size (XPID, DISPLAY) and an empty home
# for the application's settings and data ($TMP/home).
start_x() {
  local display=:$((90 + RANDOM % 9))
  Xvfb "$display" -screen 0 "${1}x24" -nolisten tcp >/dev/null 2>&1 &
  XPID=$!
  for _ in $(seq 50); do DISPLAY=$display xdotool getdisplaygeometry >/dev/null 2>&1 && break; sleep 0.1; done
  export DISPLAY=$display
  rm -rf "$TMP/home"; mkdir -p "$TMP/home/config/PhaseLab"
}
stop_x() { kill "$XPID" 2>/dev/null || true; wait "$XPID" 2>/dev/null || true; XPID=""; }

# launch OUT ERR ARGS...: the application on that home (APID); ERR "-":
# standard error goes to OUT too.
launch() {
  local out=$1 err=$2; shift 2
  local -a run=(env XDG_CONFIG_HOME="$TMP/home/config" XDG_DATA_HOME="$TMP/home/data"
                PHASELAB_DB="$TMP/home/chats.sqlite" "$APP" "$@")
  if [[ $err == - ]]; then "${run[@]}" >"$out" 2>&1 & else "${run[@]}" >"$out" 2>"$err" & fi
  APID=$!
}

# window SIZE TITLE_RE: the id of the window whose title matches, moved to
# the corner and sized to the screen.
window() {
  local win
  win=$(xdotool search --sync --onlyvisible --name "$2" | head -1)
  xdotool windowmove "$win" 0 0 windowsize "$win" "${1%x*}" "${1#*x}"
  echo "$win"
}

# focus WIN: without a window manager the focus does not come by itself.
focus() { xdotool windowactivate --sync "$1" 2>/dev/null || xdotool windowfocus --sync "$1"; }

# ask_two Q1 Q2 NAME MID AFTER: two questions in the focused window, the
# second captured MID seconds after it is sent (NAME-mid.png) and AFTER
# seconds later (NAME-after.png).
ask_two() {
  xdotool type --delay 15 "$1"
  xdotool key ctrl+Return
  sleep 5
  xdotool type --delay 15 "$2"
  xdotool key ctrl+Return
  sleep "$4"
  import -window root "$OUT/$3-mid.png"
  sleep "$5"
  import -window root "$OUT/$3-after.png"
}

# shot SIZE: one run of the application on a screen of that size.
shot() {
  local size=$1 win
  start_x "$size"
  # Serve the loaded model (any free port): the status bar says where.
  printf '[serve]\nenabled=true\nport=0\n' >"$TMP/home/config/PhaseLab/PhaseLab.conf"
  launch "$TMP/app-$size.log" - "$MODEL"
  win=$(window "$size" '^PhaseLab')
  # Loaded: the title names the model.
  for _ in $(seq 100); do xdotool getwindowname "$win" | grep -q '—' && break; sleep 0.1; done
  sleep 0.5
  focus "$win"
  # The second answer (a few dozen tokens, a fraction of a second on a fast
  # CPU) is caught while it streams.
  ask_two "Why is the sky blue?" "Explain how a car engine works, step by step." "chat-$size" 0.1 5
  # The metrics dock's second tab (where its tab bar is at this size; at
  # 800x600 a longer backend name, cpu-avx512-vnni, wraps the dock's
  # header to a third line and moves the tab bar 13 px down: both places
  # are clicked, the other click lands on a label).
  local tab_x=1075 tab_y=118
  [[ $size == 800x600 ]] && tab_x=662 tab_y=118
  xdotool mousemove "$tab_x" "$tab_y" click 1
  [[ $size == 800x600 ]] && xdotool mousemove "$tab_x" "$((tab_y + 13))" click 1
  sleep 0.5
  import -window root "$OUT/phase-meter-$size.png"
  xdotool mousemove "$((tab_x - 100))" "$tab_y" click 1
  # Settings > Servers (File > Remote Server…): serving, with its address.
  xdotool key alt+f
  sleep 0.3
  xdotool key r
  xdotool search --sync --onlyvisible --name '^Settings$' >/dev/null
  sleep 0.5
  import -window root "$OUT/settings-servers-$size.png"
  xdotool key Escape
  sleep 0.3
  focus "$win"
  # Notebook mode in a new conversation: the model continues the text (a
  # long answer, so the first capture is mid-answer).
  xdotool key ctrl+n
  sleep 0.3
  xdotool key ctrl+shift+n
  xdotool type --delay 15 "The three most important inventions of the nineteenth century were"
  xdotool key ctrl+Return
  sleep 2
  import -window root "$OUT/notebook-$size-mid.png"
  sleep 12
  import -window root "$OUT/notebook-$size-after.png"
  quit_app
  stop_x
}

# remote_shot SIZE URL: the window with no local model, chatting through the
# server at URL (remote mode, set in its settings file), and its phase meter.
remote_shot() {
  local size=$1 url=$2 win
  start_x "$size"
  printf '[remote]\nuse=true\nurl=%s\n' "$url" >"$TMP/home/config/PhaseLab/PhaseLab.conf"
  launch "$TMP/remote-$size.log" -
  win=$(window "$size" '^PhaseLab')
  # Connected: the title names the server's model.
  for _ in $(seq 100); do xdotool getwindowname "$win" | grep -q '(remote)' && break; sleep 0.1; done
  sleep 0.5
  focus "$win"
  xdotool mousemove "$((${size%x*} - 1))" "$((${size#*x} - 1))"  # (no hovered button in the pictures)
  # A first question warms the server; the second's short answer (about a
  # second: the server's prefix cache makes its first token quick) is
  # captured while it streams.
  ask_two "Why is the sky blue?" "Explain how a car engine works, step by step." "remote-$size" 0.5 6
  # The dock's tab bar sits lower: the remote note is above it.
  local tab_x=1075 tab_y=152
  [[ $size == 800x600 ]] && tab_x=662 tab_y=166
  xdotool mousemove "$tab_x" "$tab_y" click 1
  sleep 0.5
  import -window root "$OUT/remote-phase-meter-$size.png"
  quit_app
  stop_x
}

# batch_shot SIZE: phaselab --batch-sweep, the Compare window filling the
# screen, captured once the points are printed (the sweep is done).
batch_shot() {
  local size=$1
  start_x "$size"
  launch "$TMP/batch-$size.json" "$TMP/batch-$size.log" --batch-sweep 1,2,4,8 "$MODEL"
  window "$size" '^Compare models' >/dev/null
  for _ in $(seq 1200); do
    grep -q '"batch"' "$TMP/batch-$size.json" && break
    grep -q 'batch sweep:' "$TMP/batch-$size.log" && { cat "$TMP/batch-$size.log" >&2; break; }
    sleep 0.5
  done
  sleep 1
  import -window root "$OUT/batch-sweep-$size.png"
  kill "$APID" 2>/dev/null || true; wait "$APID" 2>/dev/null || true; APID=""
  stop_x
}

# get_models_shot SIZE ENDPOINT: File > Get Models… (Ctrl+Shift+G) on the
# fake hub at ENDPOINT: a search for its repositories with the first one's
# files and their fit (the fit reads each file's header from the slow CDN),
# then the Q8_0 file's download mid-way and done. The clicks are at the
# dialog's rows and buttons as it lays out at this size (900x640 on
# 1280x800, 760x520 on 800x600).
get_models_shot() {
  local size=$1 endpoint=$2 win dlg x y h file_row X Y WIDTH HEIGHT SCREEN WINDOW
  start_x "$size"
  HF_ENDPOINT=$endpoint launch "$TMP/get-models-$size.log" -
  win=$(window "$size" '^PhaseLab')
  sleep 1
  focus "$win"
  xdotool key ctrl+shift+g
  dlg=$(xdotool search --sync --onlyvisible --name '^Get Models$' | head -1)
  focus "$dlg"
  eval "$(xdotool getwindowgeometry --shell "$dlg")"
  x=$X y=$Y h=$HEIGHT
  xdotool mousemove "$((x + 200))" "$((y + 14))" click 1  # the search box
  xdotool type --delay 15 "phaselab-test"
  xdotool key Return
  sleep 1.5
  xdotool mousemove "$((x + 150))" "$((y + 91))" click 1  # the first repository
  sleep 17  # both fits: each reads the file from the slow CDN
  file_row=$((y + 378))  # the second file (Q8_0)
  [[ $size == 800x600 ]] && file_row=$((y + 326))
  xdotool mousemove "$((x + 150))" "$file_row" click 1
  xdotool mousemove "$((x + 10))" "$((y + 10))"
  sleep 0.5
  import -window root "$OUT/issue-36/get-models-$size-search.png"
  xdotool mousemove "$((x + 50))" "$((y + h - 23))" click 1  # Download
  xdotool mousemove "$((x + 10))" "$((y + 10))"
  sleep 4
  import -window root "$OUT/issue-36/get-models-$size-downloading.png"
  sleep 8
  import -window root "$OUT/issue-36/get-models-$size-done.png"
  xdotool key Escape
  quit_app
  stop_x
}

# The Get Models shots need no model: the fake hub serves stories260K,
# 64 KiB every 400 ms (a download of about 8 s).
get_models_shots() {
  mkdir -p "$OUT/issue-36"
  "$FAKE_HUB" --delay-ms 400 >"$TMP/hub.out" 2>"$TMP/hub.log" &
  HPID=$!
  local endpoint=""
  for _ in $(seq 100); do
    endpoint=$(sed -n 's/^HF_ENDPOINT=//p' "$TMP/hub.out" 2>/dev/null)
    [[ -n "$endpoint" ]] && break
    sleep 0.1
  done
  [[ -n "$endpoint" ]] || { cat "$TMP/hub.log" >&2; echo "screenshots: phaselab-fake-hub did not start" >&2; exit 1; }
  get_models_shot 1280x800 "$endpoint"
  get_models_shot 800x600 "$endpoint"
  kill "$HPID" 2>/dev/null || true; wait "$HPID" 2>/dev/null || true; HPID=""
}

if [[ $ONLY_GET_MODELS == 1 ]]; then
  get_models_shots
  echo "screenshots: written to $OUT/issue-36"
  exit 0
fi

shot 1280x800
shot 800x600
# The server the remote shots chat with: its base URL is stdout's first line.
# One thread, so that an answer streams long enough to be caught mid-way.
"$CLI" serve -m "$MODEL" --port 0 -t 1 >"$TMP/serve.out" 2>"$TMP/serve.log" &
SPID=$!
URL=""
for _ in $(seq 300); do
  URL=$(head -1 "$TMP/serve.out" 2>/dev/null)
  [[ -n "$URL" ]] && break
  kill -0 "$SPID" 2>/dev/null || { cat "$TMP/serve.log" >&2; exit 1; }
  sleep 0.1
done
[[ -n "$URL" ]] || { echo "screenshots: phaselab-cli serve did not start" >&2; exit 1; }
remote_shot 1280x800 "$URL"
remote_shot 800x600 "$URL"
kill "$SPID" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; SPID=""
batch_shot 1280x800
batch_shot 800x600
get_models_shots
cp "$OUT/chat-1280x800-after.png" "$ROOT/docs/screenshot.png"
echo "screenshots: written to $OUT (and docs/screenshot.png)"
