"""`elr-rl profile`: pass rates of a checkpoint per prompt and loop count, sampled with the rollout engine
(multi-turn environments as whole episodes) and written as the table the loop curriculum (`curriculum`)
reads. It lives in elr_rl, above `curriculum`, because it runs elr_rl's engine and episodes; `curriculum`
imports nothing of elr_rl."""
