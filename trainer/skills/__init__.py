"""AgentOPSD's general skill note (`general.txt`), written by this project.

The teacher reads it, followed by the env family's note for the episode's task type, which the family
registers with its ids (`EnvEntry.skill_notes`; the project's own are in environments/*/skills/). See
`trainer.env_knowledge.skill_text`; `CreditConfig.skills_dir` points at a folder that replaces them.
"""
