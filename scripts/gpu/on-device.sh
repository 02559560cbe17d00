#!/usr/bin/env bash
# On the GPU machine, from the project root (after scripts/gpu/pack.sh here):
#   bash .gpu/on-device.sh quick   # one call of at most 9 minutes, for a short device budget:
#                                  # encore_cuda_tests, /cuda benchmarks, the staged-arguments
#                                  # and chained-copies A/Bs,
#                                  # memcheck, racecheck and synccheck over the newest kernels,
#                                  # PyTorch side by side
#   bash .gpu/on-device.sh rest    # after quick (under 7.5 minutes): the [large] cases, racecheck,
#                                  # TinyGpt's kernels, the ENCORE_CUDA_PDL=1 A/B, op-by-op profiles
#   bash .gpu/on-device.sh recheck # after quick and a fix (under 8.5 minutes): the tests, the
#                                  # benchmarks, memcheck and racecheck wider, PyTorch side by side
#   bash .gpu/on-device.sh tests   # encore_cuda_tests; compute-sanitizer memcheck and racecheck
#   bash .gpu/on-device.sh bench   # /cuda benchmarks and where their device time goes (a file
#                                  # per KernelSum case), PyTorch side by side, the GPU demo
#   bash .gpu/on-device.sh all     # tests and bench, about twice as long
# "tests" and "bench" each finish within 9.5 minutes: every part has a time cap, the most wanted
# parts first, so that a call cut short still brings back what ran. Each part's output is
# printed and kept in $GPU_OUT (default /tmp/gpu-out).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
what=${1:-all}
# The binaries and libraries, unpacked once per machine.
run=/tmp/encore-gpu
[ -x "$run/bin/encore_cuda_tests" ] || { mkdir -p "$run" && tar -xJf "$here/payload.tar.xz" -C "$run"; } || exit 1
out=${GPU_OUT:-/tmp/gpu-out}; mkdir -p "$out"
# The CUDA libraries wherever this machine has them (the CUDA toolkit, or PyTorch's nvidia-*
# wheels): cuBLAS, cuDNN, NCCL, NVRTC (loaded with dlopen when a fused kernel is compiled). Files
# and links only: a tool's cache (perf's ~/.debug) keeps directories of those names.
libdirs=$(find /usr/local /opt /usr/lib /root -maxdepth 10 \( -name 'libcublasLt.so.13*' -o -name 'libcublas.so.13*' \
  -o -name 'libcudnn.so.9*' -o -name 'libcudnn_*.so.9*' -o -name 'libnccl.so.2*' -o -name 'libnvrtc.so.13*' \) \
  \( -type f -o -type l \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$run/lib:${libdirs}${LD_LIBRARY_PATH:-}"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$run/bin/encore_cuda_tests" | grep -E 'not found|libcu|libnccl'
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.backends.cudnn.version())' 2>&1
  command -v compute-sanitizer || echo "no compute-sanitizer"
} 2>&1 | tee "$out/env.txt"

# part NAME SECONDS CMD...: runs CMD under a time cap, its output kept in $out/NAME.txt; prints
# the last lines, and the time it took or that it was cut.
part() {
  local name=$1 cap=$2; shift 2
  local start=$SECONDS
  echo "==> $name (cap ${cap} s): $*"
  timeout --kill-after=5 "$cap" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$out/$name.txt"
  if ((rc == 124 || rc == 137)); then echo "<== $name: cut at ${cap} s"; else
    echo "<== $name: exit $rc in $((SECONDS - start)) s"; fi
}

# The parts the modes share, each with its time cap and (benchmarks) minimum time per case.
cuda_tests() {  # CAP
  TAIL=40 part cuda_tests "$1" "$run/bin/encore_cuda_tests" --durations yes
}
sanitizer() {
  command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1
}
bench_cuda() {  # CAP MIN_TIME: every /cuda case, with each KernelSum case's kernels in breakdown/
  mkdir -p "$out/breakdown"
  TAIL=80 ENCORE_BENCH_BREAKDOWN="$out/breakdown" part bench_cuda "$1" "$run/bin/encore_bench" \
    --benchmark_filter=/cuda --benchmark_repetitions=3 --benchmark_min_time="$2" \
    --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json
}
# Every product on cuBLAS (no small GEMM kernels, nothing folded into them), beside bench_cuda's.
bench_cublas_only() {  # CAP MIN_TIME CASES
  TAIL=20 ENCORE_CUDA_SMALL_GEMM=0 part bench_cublas_only "$1" "$run/bin/encore_bench" \
    --benchmark_filter="^($3)/(eager|static)/cuda|^KernelSum/MlpSmall/cuda" \
    --benchmark_repetitions=3 --benchmark_min_time="$2" --benchmark_report_aggregates_only=true
}
# The staging copies of MlpSmall's static calls on the stream before each launch, not as the
# graph's first nodes, beside bench_cuda's.
bench_stream_copies() {  # CAP MIN_TIME
  TAIL=12 ENCORE_CUDA_GRAPH_COPIES=0 part bench_stream_copies "$1" "$run/bin/encore_bench" \
    --benchmark_filter='^MlpSmall/static(_batches)?/cuda|^KernelSum/MlpSmall/cuda' \
    --benchmark_repetitions=3 --benchmark_min_time="$2" --benchmark_report_aggregates_only=true
}
# Arguments whose addresses repeat copied into staging at every launch (ENCORE_CUDA_GRAPH_DIRECT_ARGS=0)
# rather than read where they are, beside bench_cuda's.
bench_staged_args() {  # CAP MIN_TIME
  TAIL=14 ENCORE_CUDA_GRAPH_DIRECT_ARGS=0 part bench_staged_args "$1" "$run/bin/encore_bench" \
    --benchmark_filter='^(MlpSmall|SeedCnn|TinyGpt)/static(_batches)?/cuda|^KernelSum/MlpSmall/cuda' \
    --benchmark_repetitions=3 --benchmark_min_time="$2" --benchmark_report_aggregates_only=true
}
# The graphs' staging copies one after another (ENCORE_CUDA_GRAPH_COPY_CHAIN=1) rather than each
# a root of its own, beside bench_cuda's.
bench_copy_chain() {  # CAP MIN_TIME
  TAIL=14 ENCORE_CUDA_GRAPH_COPY_CHAIN=1 part bench_copy_chain "$1" "$run/bin/encore_bench" \
    --benchmark_filter='^(MlpSmall|SeedCnn|TinyGpt)/static/cuda|^KernelSum/MlpSmall/cuda' \
    --benchmark_repetitions=3 --benchmark_min_time="$2" --benchmark_report_aggregates_only=true
}
# The small GEMMs, the loss gradient and the optimizer updates launched as programmatic
# dependents (ENCORE_CUDA_PDL=1): their tests and the static ones (captures with programmatic
# edges), then the steps they run in, beside bench_cuda's.
pdl_bench() {  # CAP MIN_TIME CASES
  TAIL=20 ENCORE_CUDA_PDL=1 part bench_pdl "$1" "$run/bin/encore_bench" \
    --benchmark_filter="^($3)/(eager|static)/cuda|^KernelSum/MlpSmall/cuda" \
    --benchmark_repetitions=3 --benchmark_min_time="$2" --benchmark_report_aggregates_only=true
}
pdl() {  # CAP MIN_TIME
  TAIL=12 ENCORE_CUDA_PDL=1 ENCORE_RANDOM_PROGRAMS=60 part cuda_tests_pdl "$((2 * $1))" \
    "$run/bin/encore_cuda_tests" "[small_gemm],[optim],[cross_entropy],[graphs],[static]"
  pdl_bench "$1" "$2" 'MlpSmall|MlpLarge|CharLstm'
}
peers() {  # CAP MIN_TIME: PyTorch eager, CUDA graph and torch.compile beside bench_cuda's figures
  if [ -f "$here/peers/compare.py" ] && [ -f "$out/bench_cuda.json" ]; then
    TAIL=30 part peers "$1" python3 "$here/peers/compare.py" --cuda --torch-python python3 \
      --repetitions 3 --min-time "$2" --encore-json "$out/bench_cuda.json" --json-out "$out/peers.json"
  fi
}
kernels_per_step() {  # CASE...: the KernelSum breakdowns' kernels per step, and the start of the
  # timeline of their graph launch of median span with its span, busy and idle times
  for c in "$@"; do
    local f="$out/breakdown/KernelSum_${c}_cuda.txt"
    [ -f "$f" ] || continue
    sed -n '/^Kernels per step/,/^$/p' "$f" | head -25
    sed -n '/^The graph launch of median span/,$p' "$f" | awk 'NR <= 32 || /^span /'
  done
}
large_tests() {  # CAP: the cases hidden from a plain run for their memory (up to about 40 GiB)
  part cuda_tests_large "$1" "$run/bin/encore_cuda_tests" "[large]" --durations yes
}
racecheck_graphs() {  # SANITIZER: racecheck over a failed capture and a graph per set of values
  part racecheck 60 "$1" --tool racecheck --print-limit 20 "$run/bin/encore_cuda_tests" \
    "a failed CUDA-graph capture*,Adam's hyper-parameters on a schedule on cuda*"
}
racecheck_shared() {  # SANITIZER CAP [NAME]: racecheck (shared memory hazards) over the kernels
  # that stage chunks in shared memory with asynchronous copies (the small GEMMs, the loss
  # gradient's with its logits) or join in it; not the [loss_fold] and [update_fold] scenarios
  # (hundreds of static functions), nor [layer_norm] (its op cases alone outlast a minute).
  part "${3:-racecheck_shared}" "$2" "$1" --tool racecheck --print-limit 20 \
    "$run/bin/encore_cuda_tests" "[small_gemm]~[loss_fold]~[update_fold],[cross_entropy]"
}
profiles() {  # where eager steps and stream replays spend their time, op by op (the profiler's
  # table: an eager op's dispatch on the host, a replayed step's device time)
  mkdir -p /tmp/encore-profiles
  for c in TinyGpt/static_nograph/cuda TinyGpt/eager/cuda MlpSmall/static_nograph/cuda; do
    local f=${c//\//_}
    TAIL=0 ENCORE_PROFILE="/tmp/encore-profiles/$f.json" part "profile_$f" 30 "$run/bin/encore_bench" \
      --benchmark_filter="^$c(/|\$)" --benchmark_min_time=0.3
    cp "/tmp/encore-profiles/$f.json.txt" "$out/profile_$f.txt" 2>/dev/null && head -30 "$out/profile_$f.txt"
  done
}
run_tests() {  # caps 260 + 170 + 60 + 40 + 40 s
  cuda_tests 260
  local san
  san=$(sanitizer)
  if [ -n "$san" ]; then
    # The random programs run 60 rather than 400 under the sanitizer (ENCORE_RANDOM_PROGRAMS).
    ENCORE_RANDOM_PROGRAMS=60 part memcheck 170 "$san" --tool memcheck --print-limit 20 \
      "$run/bin/encore_cuda_tests" "[static]~[loss_fold]~[update_fold],[runtime],[models],[checkpoint],[linear]"
    racecheck_graphs "$san"
    racecheck_shared "$san" 40
  fi
  large_tests 40  # last: they take the most memory
}
run_bench() {
  bench_cuda 200 0.2
  bench_cublas_only 30 0.2 'MlpSmall|CharLstm|LstmCellChain'
  bench_stream_copies 20 0.2
  bench_staged_args 20 0.2
  bench_copy_chain 20 0.2
  # The same graphs on one stream (ENCORE_STATIC_LANES=0), and on 3, beside bench_cuda's 2 (the
  # default).
  local cases='^(MlpSmall|MlpLarge|SeedCnn|TinyGpt|CharLstm)/static/cuda|^KernelSum/(MlpSmall|TinyGpt)/cuda'
  for s in 1 3; do
    TAIL=20 ENCORE_STATIC_LANES=$((s > 1)) ENCORE_CUDA_GRAPH_STREAMS=$s part "bench_streams_$s" 30 \
      "$run/bin/encore_bench" --benchmark_filter="$cases" --benchmark_repetitions=3 \
      --benchmark_min_time=0.2 --benchmark_report_aggregates_only=true
  done
  kernels_per_step MlpSmall TinyGpt
  pdl 40 0.2
  profiles
  peers 220 0.2
  if [ -d "$here/data" ]; then
    TAIL=15 part demo 60 "$run/bin/mnist_cnn" --device cuda --compare --limit 12800 --data "$here/data"
  fi
}
# The most wanted parts of both within one call of at most 9 minutes, for a session's 15 minutes
# of device time with the start (caps 200 + 95 + 20 + 20 + 40 + 2 x 35 + 25 + 60 s): the tests, the
# benchmarks, the A/Bs of staged arguments and of chained staging copies, MlpSmall's kernels per
# step, then the sanitizers over
# the kernels that stage in shared memory (the small GEMMs with their folds, the loss gradient,
# layer_norm, the optimizers): memcheck, racecheck with programmatic launches off and on, and
# synccheck with them on; last, PyTorch side by side.
run_quick() {
  cuda_tests 200
  bench_cuda 95 0.1
  bench_staged_args 20 0.1
  bench_copy_chain 20 0.1
  kernels_per_step MlpSmall
  local san sets='[small_gemm]~[loss_fold]~[update_fold],[layer_norm],[optim],[cross_entropy]'
  san=$(sanitizer)
  if [ -n "$san" ]; then
    part memcheck 40 "$san" --tool memcheck --print-limit 20 "$run/bin/encore_cuda_tests" "$sets"
    racecheck_shared "$san" 35 racecheck_shared_pdl0
    ENCORE_CUDA_PDL=1 racecheck_shared "$san" 35 racecheck_shared_pdl1
    ENCORE_CUDA_PDL=1 part synccheck_pdl1 25 "$san" --tool synccheck --print-limit 20 \
      "$run/bin/encore_cuda_tests" "$sets"
  fi
  peers 60 0.1
}
# After quick, in what is left of a short budget (caps 60 + 60 + 60 + 45 + 80 + 40 + 3 x 30 s):
# the [large] cases, racecheck on the graph cases and the kernels that stage in shared memory,
# TinyGpt's kernels per step, the small GEMMs as
# programmatic dependents (tests and an A/B), and the op-by-op profiles of the stream replays whose
# targets are open.
run_rest() {
  large_tests 60
  local san
  san=$(sanitizer)
  if [ -n "$san" ]; then
    racecheck_graphs "$san"
    racecheck_shared "$san" 60
  fi
  mkdir -p "$out/breakdown"
  TAIL=0 ENCORE_BENCH_BREAKDOWN="$out/breakdown" part kernelsum_tinygpt 45 "$run/bin/encore_bench" \
    --benchmark_filter='^KernelSum/TinyGpt/cuda' --benchmark_min_time=0.2
  cp "$out/breakdown/KernelSum_TinyGpt_cuda.txt" "$out/kernels_TinyGpt.txt" 2>/dev/null
  rm -rf "$out/breakdown"
  pdl 40 0.1
  profiles
}
# After quick, once what it found is fixed (caps 90 + 60 + 60 + 70 + 2 x 50 + 120 s): the tests
# again, the benchmarks, memcheck over the newest kernels and over the static scenarios, racecheck
# with programmatic launches off and on, then PyTorch side by side.
run_recheck() {
  cuda_tests 90
  bench_cuda 60 0.1
  kernels_per_step MlpSmall
  local san
  san=$(sanitizer)
  if [ -n "$san" ]; then
    part memcheck 60 "$san" --tool memcheck --print-limit 20 "$run/bin/encore_cuda_tests" \
      "[small_gemm]~[loss_fold]~[update_fold],[layer_norm],[optim],[graphs],[reduce],[cross_entropy]"
    ENCORE_RANDOM_PROGRAMS=60 part memcheck_static 70 "$san" --tool memcheck --print-limit 20 \
      "$run/bin/encore_cuda_tests" "[static]~[loss_fold]~[update_fold],[runtime],[models],[linear]"
    racecheck_shared "$san" 50 racecheck_shared_pdl0
    ENCORE_CUDA_PDL=1 racecheck_shared "$san" 50 racecheck_shared_pdl1
  fi
  peers 120 0.1
}
case "$what" in
  quick) run_quick ;;
  rest) run_rest ;;
  recheck) run_recheck ;;
  tests) run_tests ;;
  bench) run_bench ;;
  all) run_tests; run_bench ;;
  *) echo "usage: on-device.sh quick|rest|recheck|tests|bench|all"; exit 2 ;;
esac
