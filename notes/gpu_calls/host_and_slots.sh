# Where the eager step's time goes now, and three dS^T slots at d = 128 (about 4 min):
# bash notes/gpu_calls/host_and_slots.sh (inside scripts/on_device.sh)
set -u
python3 notes/host_profile/gpu_vs_host.py
python3 -m cs336_systems.bench flash-host --batch 16 --heads 16 --seq 4096 --d 128 || exit 1
python3 -m cs336_systems.bench flash-ab-bwd128 --shape 1,32,8192,0 --versions full red2 --settings 2,2 2,3 3,2 || exit 1
python3 -m cs336_systems.bench flash-ab-bwd128 --shape 1,32,32768,1 --versions full --settings 3,1 2,3 2,2 || exit 1
