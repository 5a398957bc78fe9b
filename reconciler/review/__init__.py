"""Pull requests as deploy approval: forges, plan review, approval, previews, notes, reports and
notifications of each rollout."""
