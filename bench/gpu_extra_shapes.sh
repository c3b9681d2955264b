set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-index --target /tmp/pydeps .wheels/*.whl 2>&1 | tail -1
export PYTHONPATH=$PWD:/tmp/pydeps
P=/tmp/extra; mkdir -p $P
M="--device cuda --warmup 3 --repeats 10"
for tb in "1 2" "2 2" "4 2" "8 2" "8 4"; do set -- $tb
  echo "== llama3-8b 4 blocks t=$1 b=$2 $(date -u +%T)"
  timeout 80 python3 -m zbsearch profile --model llama3-8b --layers 4 --tp $1 --micro-batch $2 -p 2 $M -o $P/llama3-8b-4l-tp$1-b$2-measured.json | tail -3
done
for t in 1 2; do
  echo "== mixtral 2 blocks t=$t $(date -u +%T)"
  timeout 90 python3 -m zbsearch profile --model mixtral-8x7b --layers 2 --tp $t -p 2 $M -o $P/mixtral-8x7b-2l-tp$t-measured.json | tail -3
done
tar -czf $OUT/extra.tgz -C $P .
echo "== done $(date -u +%T)"
