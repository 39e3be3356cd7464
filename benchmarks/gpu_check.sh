#!/usr/bin/env bash
# The whole GPU check in one command (at most ~8 minutes on an H100/H200): the CUDA tests,
# the backbone against timm and torchscale at ViT-B and speech size (bf16, eager and
# compiled: ms per step, MFU, memory), a profile of the Magneto step (MFU by batch and compile
# mode, time by kernel kind), the RNN-T joint (whole lattice vs sub-batches) and one short run
# of each paper-size config. Everything lands in OUT; OUT/summary.md is the table.
#
#   benchmarks/gpu_check.sh OUT [--wheels DIR] [--budget SECONDS] [--paper NAME,NAME]
#   benchmarks/gpu_check.sh OUT --device cpu --tiny          # the smoke test CI runs
#
# No editable install: the checkout goes on PYTHONPATH, and --wheels DIR (wheels for the
# machine's Python of what it lacks: omegaconf, torchscale, the extras) is installed into a
# folder placed ahead of the machine's own packages. Each step runs with its own time limit
# and its log in OUT; a failing step is recorded and the next one runs; a step that would
# start past the budget is skipped and says so.
set -u
usage() { echo "usage: $0 OUT [--wheels DIR] [--device cuda|cpu] [--tiny] [--budget SECONDS] [--paper NAMES]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
WHEELS="" DEVICE=cuda TINY=0 BUDGET=480 ONLY=
while [ $# -gt 0 ]; do
    case $1 in
        --wheels) WHEELS=$2; shift 2 ;;
        --device) DEVICE=$2; shift 2 ;;
        --tiny) TINY=1; shift ;;
        --budget) BUDGET=$2; shift 2 ;;
        --paper) ONLY=$2; shift 2 ;;  # comma-separated: only these paper-size configs
        *) usage ;;
    esac
done
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
: > "$OUT/steps.tsv"

if [ -n "$WHEELS" ]; then
    SITE=$OUT/site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
        > "$OUT/wheels.log" 2>&1 || { echo "gpu_check: installing the wheels in $WHEELS failed (see $OUT/wheels.log)" >&2; exit 1; }
    export PYTHONPATH=$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 GPU_TEST_REPORT=$OUT/gpu_tests.jsonl
rm -f "$GPU_TEST_REPORT"

# step NAME LIMIT_SECONDS COMMAND...: run it with stdout+stderr to OUT/NAME.log, record
# name / exit status / seconds in steps.tsv (124: over its limit; "skipped": past the budget)
step() {
    local name=$1 limit=$2; shift 2
    local now; now=$(date +%s)
    local left=$((BUDGET - (now - START)))
    if [ "$left" -lt 20 ]; then
        printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
        echo "== $name: skipped, the ${BUDGET} s budget is spent"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit} s)"
    local t0; t0=$(date +%s)
    (cd "$REPO" && timeout -k 10 "$limit" "$@") > "$OUT/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$OUT/steps.tsv"
    echo "   exit $rc after $(( $(date +%s) - t0 )) s"
}

step environment 60 "$PY" -c "
import platform, torch
print('python', platform.python_version(), '| torch', torch.__version__, '| cuda', torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('device', p.name, '|', p.multi_processor_count, 'SMs |', round(p.total_memory / 2**30), 'GiB')
for name in ('timm', 'torchaudio', 'omegaconf', 'torchscale', 'espnet', 'open_clip', 'mmseg', 'mmengine'):
    try:
        m = __import__(name)
        print(name, getattr(m, '__version__', '?'))
    except Exception as e:
        print(name, 'missing:', type(e).__name__, str(e).splitlines()[0][:120])
"
command -v nvidia-smi > /dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

step gpu_tests 180 "$PY" -m pytest -m gpu tests/gpu -q -rs -p no:cacheprovider --timeout=150

BENCH=("$PY" benchmarks/bench_backbone.py --device "$DEVICE" --progress)
if [ "$TINY" = 1 ]; then
    VITB=(--dim 64 --depth 2 --heads 2 --tokens 17 --batch 2 --reps 2 --steps 1 --warmup 1)
    SPEECH=(--dim 32 --depth 3 --heads 2 --tokens 25 --batch 2 --reps 2 --steps 1 --warmup 1)
    RNNT=(--batch 2 --frames 20 --units 5 --vocab 31 --joint-dim 16 --sub-batch 1)
    PAPER=(--tiny)
    PROFILE=(--tiny)
    COMPILED_MODELS=("ours magneto")
    COMPILE=(--compile --compile-backend eager)  # graph capture only: the smoke test stays quick
else
    [ "$DEVICE" = cuda ] && BENCH+=(--dtype bf16)
    VITB=(--dim 768 --depth 12 --heads 12 --tokens 197 --batch 64 --reps 10 --steps 3 --warmup 3)
    SPEECH=(--dim 512 --depth 18 --heads 8 --tokens 500 --batch 32 --reps 10 --steps 3 --warmup 3)
    RNNT=(--batch 32 --frames 400 --units 80 --vocab 5001 --joint-dim 512 --sub-batch 4 8)
    COMPILED_MODELS=("ours magneto" "timm Sub-LN" "ours preln" "timm Pre-LN")
    COMPILE=(--compile)
    PAPER=(--workers 8)
    PROFILE=()
fi
[ -n "$ONLY" ] && PAPER+=(--only ${ONLY//,/ })
step vitb_eager 90 "${BENCH[@]}" "${VITB[@]}" --json "$OUT/vitb_eager.json"
step vitb_compiled 150 "${BENCH[@]}" "${VITB[@]}" "${COMPILE[@]}" --models "${COMPILED_MODELS[@]}" --json "$OUT/vitb_compiled.json"
step profile 150 "$PY" benchmarks/profile_step.py --device "$DEVICE" "${PROFILE[@]}" --out "$OUT/profile"
step rnnt_joint 90 "$PY" benchmarks/bench_rnnt_joint.py --device "$DEVICE" "${RNNT[@]}" --json "$OUT/rnnt_joint.json"
step speech_eager 90 "${BENCH[@]}" "${SPEECH[@]}" --json "$OUT/speech_eager.json"
step speech_compiled 150 "${BENCH[@]}" "${SPEECH[@]}" "${COMPILE[@]}" --models "${COMPILED_MODELS[@]:0:2}" --json "$OUT/speech_compiled.json"
LEFT=$((BUDGET - ($(date +%s) - START) - 10))
step paper_sizes "$LEFT" "$PY" benchmarks/paper_sizes.py --device "$DEVICE" "${PAPER[@]}" --deadline "$((LEFT - 15))" \
    --out "$OUT/paper_sizes"

"$PY" "$REPO/benchmarks/gpu_report.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "gpu_check: $(( $(date +%s) - START )) s; logs and JSON in $OUT"
# the check failed if a step failed or never ran; the summary says which
! grep -qvP '\t0\t' "$OUT/steps.tsv"
