"""Loading causal LMs in Hugging Face layout and running them with their last hidden states."""
