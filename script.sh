set -m
export SPLITRL_TLS=plaintext SPLITRL_ENV=splitrl/Catch-v0 SPLITRL_FRAME_SIZE=36 SPLITRL_WIDTH=256
splitrl serve replay --port 50053 &
splitrl serve inference --port 50052 --replay-address 127.0.0.1:50053 --mode split &
splitrl serve learner --port 50054 --replay-address 127.0.0.1:50053 --inference-address 127.0.0.1:50052 --mode split &
splitrl serve edge-encoder --port 50051 --inference-address 127.0.0.1:50052 --learner-address 127.0.0.1:50054 --mode split &
splitrl serve environment --encoder-address 127.0.0.1:50051 --max-steps 2000
kill %1 %2 %3 %4
