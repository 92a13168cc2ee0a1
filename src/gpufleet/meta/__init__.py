"""Distributed meta-learning for recommendation models (G-Meta).

``prepare`` turns interactions into one record per task (support and query sets), the Meta-IO loader feeds
whole tasks to each rank, ``train`` runs MAML over a DLRM with embedding rows sharded across ranks
(all-to-all lookups) and dense layers replicated (one all-reduce per outer step). torch is needed only by
the training, evaluation and benchmark modules, never by ``prepare`` or the CLI's help.
"""
