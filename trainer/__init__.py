"""Per-turn credit (`credit/`), teacher contexts and scoring, the local trainer, the OpenRLHF bridge."""
