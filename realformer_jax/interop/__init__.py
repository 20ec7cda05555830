"""Moving weights between this project and other frameworks (Hugging Face BERT)."""
