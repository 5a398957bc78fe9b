"""Pull requests as deploy approval: forges, plan review, approval, previews, notes, reports."""
