"""Schema objects hash by value, once: equal objects hash alike, a copy with changes hashes as
what it became, and the memo is invisible to equality and serialization."""

import copy
import pickle

from planner.files.models import load_model


def test_equal_models_hash_alike_and_a_changed_copy_hashes_as_what_it_became() -> None:
    model = load_model("tiny-moe")
    first = hash(model)
    assert hash(model) == first == hash(load_model("tiny-moe"))
    changed = model.model_copy(update={"num_hidden_layers": model.num_hidden_layers + 1})
    rebuilt = type(model).model_validate(changed.model_dump())
    assert changed == rebuilt and changed != model
    assert hash(changed) == hash(rebuilt)
    for twin in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model), copy.copy(model)):
        assert twin == model and hash(twin) == first
    assert "_memo_hash" not in model.model_dump()
