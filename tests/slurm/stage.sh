#!/usr/bin/env bash
# Staging a dataset from S3 in sbatch slurm/train.sbatch (STAGE_FROM/STAGE_TO): two jobs that
# start together on two nodes and stage Fashion-MNIST from moto's S3 (served on loopback, through
# the real AWS CLI) into one shared directory download each object once, then both train on it
# (--data-dir added by the script); a job with a wrong STAGE_FROM fails at once, not requeued.
source "$(dirname "$0")/common.sh"
for tool in aws moto_server; do
  command -v "$tool" > /dev/null || { echo "SKIPPED: no $tool (the AWS CLI and moto's server)"; exit 77; }
done
# moto without its server extra (Flask; moto[all] leaves it out) has a moto_server that fails on import.
moto_server --help > /dev/null 2>&1 < /dev/null ||
  { echo "SKIPPED: moto_server cannot start: install moto with its server extra, 'moto[all,server]>=5' (README)"; exit 77; }
slurm_setup 2 300
moto_port=$(free_port)
endpoint="http://127.0.0.1:$moto_port"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
marker="HPCTRAIN_SLURM_CLUSTER=$CLUSTER_DIR"  # local-cluster.sh down stops what carries it
env "$marker" moto_server -H 127.0.0.1 -p "$moto_port" > "$TEST_DIR/moto.log" 2>&1 &
deadline=$((SECONDS + 30))
until aws --endpoint-url "$endpoint" s3 mb s3://data > /dev/null 2>&1; do
  ((SECONDS < deadline)) || fail "moto's server did not start"
  sleep 0.5
done
aws --endpoint-url "$endpoint" s3 sync "$FASHION_MNIST" s3://data/fashion-mnist --only-show-errors ||
  fail "cannot upload the dataset to moto"

# Both jobs at once, one per node, staging into the same directory.
args=(--device cpu --model cnn --global-batch-size 128 --train-samples 2000 --test-samples 500 --epochs 1)
jobs=()
for name in first second; do
  JOB=$(CHECKPOINT_DIR="$WORK/$name" STAGE_FROM=s3://data/fashion-mnist STAGE_TO="$WORK/data" \
    STAGE_ARGS="--endpoint-url $endpoint" sbatch --parsable --job-name="$name" --output="$WORK/$name.out" \
    "${LOCAL_FIT[@]}" --nodes=1 "$repo/slurm/train.sbatch" "${args[@]}") || fail "sbatch refused $name"
  jobs+=("$JOB")
done
for j in "${jobs[@]}"; do wait_state "$j" COMPLETED 180; done
say "both jobs completed"
for name in first second; do
  expect_out "$name" "staging s3://data/fashion-mnist into $WORK/data"
  expect_out "$name" "the dataset is in $WORK/data"
  expect_out "$name" "--data-dir $WORK/data"
  expect_out "$name" "data: fashion-mnist from $WORK/data"
  expect_out "$name" "the training finished"
done
# One of them downloaded; the other found it staged (having waited, or after it was done).
cat "$WORK/first.out" "$WORK/second.out" > "$TEST_DIR/both.out"
[[ $(grep -c "hpcdata: staging 4 objects" "$TEST_DIR/both.out") == 1 ]] || fail "not exactly one job downloaded"
grep -q "is already staged in $WORK/data" "$TEST_DIR/both.out" || fail "the other job did not find it staged"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  # The CLI fetches an object above 8 MiB in 8 MiB ranges: one download is that many GETs.
  size=$(stat -c %s "$FASHION_MNIST/$f")
  parts=$(((size > 8388608) ? (size + 8388607) / 8388608 : 1))
  n=$(awk -v k="GET /data/fashion-mnist/$f " 'index($0, k) { c++ } END { print c + 0 }' "$TEST_DIR/moto.log")
  [[ "$n" == "$parts" ]] || fail "$f was fetched in $n requests: not once ($parts)"
  cmp -s "$FASHION_MNIST/$f" "$WORK/data/$f" || fail "$f differs from its source"
done
say "each object downloaded once, both jobs trained on it"

# A wrong STAGE_FROM: hpcdata's usage error fails the job, which is not requeued.
JOB=$(CHECKPOINT_DIR="$WORK/bad" STAGE_FROM=http://data/x STAGE_TO="$WORK/data2" sbatch --parsable \
  --job-name=bad --output="$WORK/bad.out" "${LOCAL_FIT[@]}" --nodes=1 "$repo/slurm/train.sbatch" "${args[@]}") ||
  fail "sbatch refused bad"
wait_state "$JOB" FAILED 60
[[ "$(job_field "$JOB" ExitCode)" == 2:0 ]] || fail "exit code $(job_field "$JOB" ExitCode), not 2:0"
[[ "$(job_field "$JOB" Restarts)" == 0 ]] || fail "a wrong STAGE_FROM was requeued"
expect_out bad "is not an S3 URL"
expect_out bad "settings are wrong (hpcdata exit 2): not requeued"
say "PASS"
