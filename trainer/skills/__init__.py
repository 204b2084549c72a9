"""AgentOPSD's privileged skill notes: static strategy text per task type, written by this project.

The teacher reads `general.txt` followed by the note of the episode's env family and task type,
`<family>-<task type>.txt` (family: alfworld, webshop, searchqa). Replace any file, or point
`CreditConfig.skills_dir` at a folder of your own with the same names; `trainer.teacher.skill_text`
resolves aliases (ALFWorld's long task names, WebShop's food/furniture, QA data set names).

    general.txt
    alfworld-{pick,look,clean,heat,cool,pick_two}.txt
    webshop-{beauty,electronics,fashion,garden,grocery}.txt
    searchqa-{single_hop,multi_hop}.txt
"""
