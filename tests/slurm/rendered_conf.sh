#!/usr/bin/env bash
# The slurm.conf that the AWS head node's bootstrap renders (cloudformation/node/
# render_slurm_conf.py) is accepted by a real slurmctld: started with it (beside a local cluster's
# munged), the controller answers, and the compute nodes are cloud nodes, powered down, with
# their GPUs and power-saving programs as rendered.
source "$(dirname "$0")/common.sh"
# Booted under umask 000 (root's shell may have it): nothing the cluster made is others' to write
# but munged's socket and the nodes' sticky TMPDIRs, which are for every user (it refused its own
# 0777 directory, left behind).
umask 000
slurm_setup 1 120
umask 022
writable=$(find "$CLUSTER_DIR" ! -type s ! -type l -perm -0002 ! -perm -1000 | head -n 3)
[[ -z "$writable" ]] || fail "local-cluster.sh under umask 000 made these writable by others: $writable"

# start_rendered DIR MAX_NODES: a slurmctld on the bootstrap's slurm.conf for MAX_NODES compute
# nodes (48 CPUs and 4 GPUs each), rendered into DIR; SLURM_CONF then names it.
start_rendered() {
  local rendered=$1 port deadline
  port=$(free_port)
  mkdir -p "$rendered"/{state,spool,log}
  chown slurm: "$rendered"/{state,log}
  python3 "$repo/cloudformation/node/render_slurm_conf.py" --cluster hpctrain-aws --controller localhost \
    --max-nodes "$2" --cpus 48 --gpus 4 --memory-mib 180000 --suspend-minutes 10 \
    --programs "$repo/cloudformation/node" --state-dir "$rendered/state" --spool-dir "$rendered/spool" \
    --log-dir "$rendered/log" --port "$port" --munge-socket "$CLUSTER_DIR/munge/munge.socket" --epilog "$repo/slurm/epilog.sh" \
    --out "$rendered/etc" || fail "render_slurm_conf.py failed"
  # The bootstrap's config has no address for localhost: pin it to loopback for this machine.
  sed -i 's/^SlurmctldHost=localhost$/SlurmctldHost=localhost(127.0.0.1)/' "$rendered/etc/slurm.conf"
  export SLURM_CONF="$rendered/etc/slurm.conf"
  env "HPCTRAIN_SLURM_CLUSTER=$CLUSTER_DIR" slurmctld -f "$SLURM_CONF" -i || fail "slurmctld refused the rendered slurm.conf"
  deadline=$((SECONDS + 30))
  until scontrol ping 2> /dev/null | grep -q 'is UP'; do
    ((SECONDS < deadline)) || { tail -n 20 "$rendered/log/slurmctld.log" >&2; fail "slurmctld with the rendered config is not up"; }
    sleep 0.3
  done
}

# sample_job FORM NODES: the sbatch command of the stack's LoginAndSubmit output (FORM 1: GPU
# nodes, 2: CPU-only), with the values of these nodes (48 CPUs, 4 GPUs) and its --nodes as the
# template's OneComputeNode condition gives it; into the array `command`.
sample_job() {
  local line
  line=$(grep -o "sbatch --nodes=[^ ]* --ntasks-per-node=[^ ]* --gpus-per-node=[^ ]* --cpus-per-task=[^ ]*" \
    "$repo/cloudformation/cluster.yaml" | sed -n "${1}p")
  [[ -n "$line" ]] || fail "cluster.yaml's LoginAndSubmit has no sbatch line $1"
  line=${line//'${Nodes}'/$2}
  line=${line//'${ComputeGpus}'/4}
  line=${line//'${ComputeCpus}'/48}
  eval "line=\"$line\""  # $((48/4)), as the head node's shell works it out
  read -r -a command <<< "$line"
}

start_rendered "$TEST_DIR/aws" 4
rendered="$TEST_DIR/aws"
nodes=$(sinfo -h -N -o '%N %T %G' | sort -u | tr '\n' ';')
say "nodes: $nodes"
[[ "$nodes" == "gpu-1 idle~ gpu:4;gpu-2 idle~ gpu:4;gpu-3 idle~ gpu:4;gpu-4 idle~ gpu:4;" ]] ||
  fail "not four powered-down cloud nodes with 4 GPUs each: $nodes"
config=$(scontrol show config)
grep -q "ResumeProgram *= $repo/cloudformation/node/resume.py" <<< "$config" || fail "ResumeProgram not as rendered"
grep -q "SuspendTime *= 600 sec" <<< "$config" || fail "SuspendTime not 10 minutes"
[[ "$(scontrol show node gpu-1)" == *CLOUD* ]] || fail "gpu-1 is not a CLOUD node"
# The stack's sample job (its LoginAndSubmit output, for these nodes' 48 CPUs and 4 GPUs) fits
# them, where train.sbatch's own 8 tasks and GPUs a node do not; a CPU-only cluster's form
# (--gpus-per-node=0) is taken too.
for form in 1 2; do
  sample_job "$form" 2
  "${command[@]}" --test-only "$repo/slurm/train.sbatch" > "$TEST_DIR/test-only.$form" 2>&1 ||
    fail "the sample job (${command[*]}) does not fit the nodes: $(cat "$TEST_DIR/test-only.$form")"
  grep -q "to start at" "$TEST_DIR/test-only.$form" || fail "sbatch --test-only said: $(cat "$TEST_DIR/test-only.$form")"
  say "sample job fits: ${command[*]}"
done
sbatch --test-only "$repo/slurm/train.sbatch" > "$TEST_DIR/test-only.plain" 2>&1 &&
  fail "train.sbatch's own 8 tasks and GPUs a node fit nodes of 4 GPUs: $(cat "$TEST_DIR/test-only.plain")"
say "train.sbatch alone is refused: $(tail -n 1 "$TEST_DIR/test-only.plain")"

# A cluster of MaxComputeNodes 1: the sample job asks for its one node, and fits; train.sbatch's
# two nodes do not.
start_rendered "$TEST_DIR/aws-one" 1
for form in 1 2; do
  sample_job "$form" 1
  "${command[@]}" --test-only "$repo/slurm/train.sbatch" > "$TEST_DIR/test-only-one.$form" 2>&1 ||
    fail "on one node, the sample job (${command[*]}) does not fit: $(cat "$TEST_DIR/test-only-one.$form")"
  say "on one node, the sample job fits: ${command[*]}"
done
sample_job 1 2
"${command[@]}" --test-only "$repo/slurm/train.sbatch" > "$TEST_DIR/test-only-one.two" 2>&1 &&
  fail "two nodes fit a cluster of one: $(cat "$TEST_DIR/test-only-one.two")"
say "on one node, two are refused: $(tail -n 1 "$TEST_DIR/test-only-one.two")"
say "PASS"
