# Every attention GPU test of the raw launch's code, then three dS^T slots at d = 128 (about 6.5 min):
# bash notes/gpu_calls/tests_and_slots.sh (inside scripts/on_device.sh)
set -u
bash scripts/attention/gpu_tests.sh 330; rc=$?
python3 -m cs336_systems.bench flash-ab-bwd128 --shape 1,32,8192,0 --versions full --settings 2,2 2,3 3,2
python3 -m cs336_systems.bench flash-ab-bwd128 --shape 1,32,32768,1 --versions full --settings 3,1 2,3
exit $rc
