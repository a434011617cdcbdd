#!/bin/bash
# Table 5 rows on ML-1m at dropout 0.1 on a lent GPU: default, h=1, h=4, h=8 at once, each stopped by early stopping or BUDGET s.
# Usage (repository root): bash .cache/gpu/ablation.sh OUT [DEVICE DATASET BUDGET]
export PYTHONUNBUFFERED=1
OUTD=$1; DEV=${2:-cuda}; DS=${3:-ml-1m}; BUDGET=${4:-430}; W=/tmp/abl-$DS
python -c "import recbench.benchmarks" 2>/dev/null || { mkdir -p /tmp/rb/recbench; for d in datasets models benchmarks reports; do ln -sfn "$PWD/$d" /tmp/rb/recbench/$d; done; export PYTHONPATH=/tmp/rb; }
{ nvidia-smi; python -c "import torch; print(torch.__version__, torch.version.cuda)"; git rev-parse HEAD 2>/dev/null; } > $OUTD/smi.txt 2>&1
date -u +%FT%TZ > $OUTD/started.txt
timeout $((BUDGET + ${SLACK:-100})) python benchmarks/studies.py ablation --datasets $DS --data-dir .cache/gpu --cache-dir /tmp/cache-$DS \
  --device $DEV --jobs ${JOBS:-4} --threads 1 --set bert4rec:dropout=0.1 --set bert4rec:attention_dropout=0.1 \
  --set time_budget_s=$BUDGET --variants ${VARIANTS:-default h=1 h=4 h=8} --output $W --no-report --no-estimate > $OUTD/ablation.log 2>&1
echo "study exit $?" >> $OUTD/ablation.log
date -u +%FT%TZ >> $OUTD/started.txt
tar czf $OUTD/ablation.tar.gz --exclude='checkpoints' --exclude='*.pt' -C $W . 2>> $OUTD/ablation.log
python - "$W" > $OUTD/rows.txt 2>&1 <<'PY'
import json, sys, pathlib
for line in pathlib.Path(sys.argv[1], "results.jsonl").read_text().splitlines():
    r = json.loads(line)
    keep = {k: r.get(k) for k in ("variant", "label", "seed", "protocol", "stopped_by", "epochs_run", "best_epoch", "train_seconds", "device")}
    m = r.get("metrics", {})
    print(json.dumps(keep), {k: m.get(k) for k in ("NDCG@10", "HR@10")})
PY
tail -40 $OUTD/ablation.log
