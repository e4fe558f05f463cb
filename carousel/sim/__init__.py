"""The simulator: the simulated tape library (library.py, on tape.py's physics), restore
campaigns (workload.py), their replay through the real loop or a baseline (replay.py), the
physical lower bound (lowerbound.py) and the plots of a replay (plots.py). The live simulated
stager (stagers/simulated.py) drives the same library on the wall clock."""
