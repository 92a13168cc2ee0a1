"""Find why a distributed training job is slow: profiler-trace readers, per-function behaviour summaries,
differential localisation (PerfTracker), straggler detection, an online monitor and a test workload."""
