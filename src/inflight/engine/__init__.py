"""The serving engine (chapters 5-8), laid out like nano-vllm's `engine/`:

- `llm_engine`    `LLMEngine`: submission, the five-step iteration, outputs and stats
- `scheduler`     reap, budget, admit, preempt, and the batch handed to the model
- `budget`        what admission may hand out in a step (`compute_budget`, chapter 6's exercise)
- `scheduler_types` the scheduler's knobs, step log and batch description
- `liveness`      the submission rule every accepted request can finish under, and the stall check
- `block_manager` the pool of KV blocks (`BlockAllocator`, `blocks_needed`)
- `prefix_cache`  blocks shared by content key (`PrefixCachingBlockAllocator`)
- `sequence`      one request's state (`num_computed_tokens`, block table, clock)
- `parallel_sampling` the `n` samples of one prompt: the fork, shared blocks, copy-on-write
- `logprobs`      which logits rows a step needs for log-probabilities, and where they go
- `sampling`      `SamplingParams`
- `priority`      priority keys, aging, and the preemption victim
- `model_runner`  tensors for one step: input preparation, KV sizing, swap copies
- `engine_args`   what `LLMEngine`'s constructor accepts (device, tokenizer, KV allocation)
- `outputs`       `RequestOutput` (with a `CompletionOutput` per sample), `StepStats`, the run's totals
- `output_processor` a step's sequences into `RequestOutput`s: text, stop strings, snapshots
- `invariants`    the debug checks that the books balance
- `gc_heap`       the startup heap frozen, out of the garbage collector's full passes
- `kv_transfer`   prefill/decode disaggregation: a request's KV out of one engine and into another
- `executor`      tensor parallelism, the driver: `MultiprocExecutor` starts N workers and sends each step
- `worker`        tensor parallelism, one worker process: its shard, the KV of its heads, its loop
- `parallel_runner` the driver's stand-ins for the workers' KV cache, swapper and model runner

The engine imports the model layer and nothing above it (`sim`, `bench`, `book`, `exercises`).
"""
