"""Run by tests/test_data_parallel.py: ImmunizationTrainer on a tiny BERT for 3 SGD steps.

``python tests/_scale_hf.py OUT`` trains on one process (64 examples per step);
``python -m torch.distributed.run --nproc_per_node 2 tests/_scale_hf.py OUT`` on two (32 each,
gloo). Rank 0 saves the trained parameters to ``OUT/weights{world}.pt``. The examples have
padding (different lengths), so the ranks hold different numbers of token rows."""

from __future__ import annotations

import os
import sys
import warnings

import torch
import transformers

from condreg.torch.hf import ImmunizationTrainer


class Tokens(torch.utils.data.Dataset):
    def __init__(self, ids, lengths, labels=None):
        self.ids, self.lengths, self.labels = ids, lengths, labels

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        mask = (torch.arange(self.ids.shape[1]) < self.lengths[i]).long()
        item = {"input_ids": self.ids[i] * mask, "attention_mask": mask}
        if self.labels is not None:
            item["labels"] = self.labels[i]
        return item


def datasets():
    g = torch.Generator().manual_seed(0)
    ids_p = torch.randint(1, 16, (64, 6), generator=g)
    ids_h = torch.randint(16, 32, (64, 6), generator=g)
    len_p = torch.randint(3, 7, (64,), generator=g)
    len_h = torch.randint(3, 7, (64,), generator=g)
    return Tokens(ids_p, len_p, (ids_p[:, 1] > 7).long()), Tokens(ids_h, len_h)


def model():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=8,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    m = transformers.BertForSequenceClassification(cfg).double()
    for p in m.bert.embeddings.parameters():
        p.requires_grad_(False)
    return m


def main(out: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pretrain, harmful = datasets()
    m = model()
    args = transformers.TrainingArguments(
        output_dir=out,
        max_steps=3,
        per_device_train_batch_size=64 // world,
        learning_rate=0.05,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1e9,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = ImmunizationTrainer(
        model=m,
        args=args,
        train_dataset=pretrain,
        harmful_dataset=harmful,
        immunized="bert.encoder.layer.0.attention.self.query",
        lam_p=1.0,
        lam_h=0.1,
        local=bool(os.environ.get("CONDREG_TEST_LOCAL")),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    if trainer.args.process_index == 0:
        weights = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        torch.save(weights, os.path.join(out, f"weights{world}.pt"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1])
    # Leave the process group before the interpreter exits: a gloo thread still running at
    # shutdown can abort the process ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
