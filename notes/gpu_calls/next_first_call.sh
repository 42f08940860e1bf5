# The next first call (prepared, not run): the non-causal d = 128 backward's candidates at the two
# cells furthest behind, and where the eager step's host time goes now (launcher pieces timed too).
# About 4 minutes: bash notes/gpu_calls/next_first_call.sh (inside scripts/on_device.sh)
set -u
python3 notes/host_profile/host_split.py
for s in 1,32,8192,0 1,32,32768,0; do
  python3 -m cs336_systems.bench flash-ab-bwd128 --shape $s --versions full red2 no_reduce stats_first delta_early \
      dq_under_dk --settings 2,2 2,1 || exit 1
done
