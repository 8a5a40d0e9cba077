"""DeepSpeed configs as users bring them, copied from public examples (the unit and e2e tests share them)."""

# LLaMA-Factory's examples/deepspeed/ds_z2_config.json, as users copy it: ZeRO-2, everything the trainer knows "auto"
ZERO2_AUTO = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                          "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                          "contiguous_gradients": True, "round_robin_gradients": True},
}
# transformers' tests/deepspeed/ds_config_zero2.json: the same with a WarmupLR scheduler and ZeRO-Offload to the CPU
ZERO2_OFFLOAD = {
    **ZERO2_AUTO,
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {**ZERO2_AUTO["zero_optimization"], "offload_optimizer": {"device": "cpu",
                                                                                   "pin_memory": True}},
}
