"""Where desired state comes from: the git clone, commit trust (signatures), the parse cache."""
