# call 42: the backward's head groups and dq_first at the grid's d = 128 shapes; the host split
set -u
python3 notes/host_profile/host_split.py
for s in 1,16,4096,1 1,32,4096,1 1,16,8192,1 1,32,8192,1 1,16,32768,1 1,32,32768,1; do
  h=$(echo $s | cut -d, -f2); g="0 1 2 4 8 16"; [ "$h" = 32 ] && g="$g 32"
  python3 -m cs336_systems.bench flash-ab-bwd128 --shape $s --versions full dq_first --settings 2,1 3,1 --groups $g || exit 1
done
for s in 1,16,4096,0 1,32,8192,0 1,32,32768,0; do
  h=$(echo $s | cut -d, -f2)
  python3 -m cs336_systems.bench flash-ab-bwd128 --shape $s --versions full dq_first --settings 2,2 3,1 --groups 0 1 4 $h || exit 1
done
