"""Part I, torch-free: the schedulers of chapters 2-4 and 8, seeded workloads, the step simulator,
and chapter 5's KV-utilisation simulator. Nothing here imports torch, so these chapters run
anywhere Python does."""
