"""Tooling for a GPU machine: the GPU check (`python -m gpu.check`), the script that runs it on
a machine with torch but no package index (`check_on_device.sh`), the wheels it needs there
(`wheels.txt`, fetched by `make gpu-wheels`), and a simulation of that machine's Python
environment on a CPU machine (`simulate_device.sh`, `make gpu-sim`). The GPU benchmarks they
time (`benchmarks.gpu_train`, `benchmarks.gpu_shapes`) stay with the other benchmarks."""
