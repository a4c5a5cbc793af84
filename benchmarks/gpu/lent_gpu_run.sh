#!/bin/bash
# How the tables under sim/data/microbench/<gpu>/2026-11-28/ were taken: one call on a lent
# single-GPU machine (the repository copied there, $OUT brought back), run from the repository root:
#   FULL_S=240 bash benchmarks/gpu/lent_gpu_run.sh
# It names the GPU, writes the shipped plan, runs `microbench run` on it, then times whole forward
# passes (benchmarks/gpu/forward_pass.py), and tars everything into $OUT/mb.tgz. On the H200 a
# second call resumed the run (`microbench run --plan DIR/plan.csv --out DIR --resume`) after the
# collector learned the plan's `rms_norm` name, and timed Qwen3-32B forward passes
# (`forward_pass.py --model qwen3-32b --shapes prefill:2048,prefill:8192,decode:1x1024,decode:64x1024,decode:128x1024`).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) HW=h200_sxm;; *H100*) HW=h100_sxm;; *) HW=unknown;; esac
echo "gpu: $name -> $HW"
nvidia-smi > $OUT/smi_before.txt 2>&1; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE >> $OUT/smi_before.txt 2>&1
python3 -c "import torch,numpy,sys;print('python',sys.version.split()[0],'torch',torch.__version__,'cuda',torch.version.cuda,'numpy',numpy.__version__,torch.cuda.get_device_name())"
for m in flash_attn flash_attn_interface flashinfer vllm flash_mla deep_ep; do python3 -c "import $m" 2>/dev/null && echo "has $m"; done
K="python3 -m orchestrator.cli"
$K microbench plan --hardware $HW --out /tmp/plan.csv || exit 3
D=/tmp/mb/$HW/2026-11-28
start=$(date +%s)
timeout ${FULL_S:-430} $K microbench run --plan /tmp/plan.csv --out $D ${RESUME:-} 2>$OUT/progress.log
rc=$?
echo "run rc=$rc wall=$(( $(date +%s) - start )) s"
tr '\r' '\n' < $OUT/progress.log | grep -v '^\s*$' | tail -12
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > $OUT/smi_after.txt 2>&1
cp /tmp/plan.csv $D/plan.csv
mkdir -p $D/forward
timeout 150 python3 benchmarks/gpu/forward_pass.py --model llama-3.1-8b --out $D/forward/llama-3.1-8b.csv --profile prefill:8192 --profile-out $D/forward/llama-3.1-8b_profile_prefill8192.csv 2>&1 | grep -v "^{" | tail -3; echo "forward rc=$?"
tar czf $OUT/mb.tgz -C /tmp mb
ls -la $D
python3 - <<'P'
import csv, collections, glob
f = glob.glob('/tmp/mb/*/2026-11-28/points.csv')[0]
rows = list(csv.DictReader(open(f)))
c = collections.Counter((r.get('kernel'), r.get('status')) for r in rows)
for k, v in sorted(c.items(), key=str): print(k, v)
P
