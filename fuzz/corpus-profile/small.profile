strata-profile 1
# a strata residency profile: `strata profile show FILE` summarises it
model 0123456789abcdef qwen3moe
geometry 2 4 2 17920 Q4_K Q4_K Q8_0
budget 1048576 4 25
warmup 2 20 12
probe cuda
probe-prompt 3 10 20 30
probe-out 2 5 6
count 0 5 0 3 1
last 0 12 0 9 2
frozen 0 0 2
count 1 0 7 1 2
last 1 0 11 3 12
frozen 1 1
end
