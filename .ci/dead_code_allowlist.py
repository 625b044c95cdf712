"""Names vulture cannot see used (tests/run.sh runs it over the whole tree): each is called or
read by something outside the tree, by name. One line each, with who uses it."""

# ruff: noqa: B018, F821, INP001, SLF001 - vulture's form: a bare reference marks a name used

_.on_moved  # watchdog's FileSystemEventHandler (supervisor/ranks/checkpoints.py)
_.on_created  # watchdog's FileSystemEventHandler
_.set_up_storage_writer  # torch.distributed.checkpoint's StorageWriter (dcp_async.py)
_.prepare_local_plan  # StorageWriter
_.prepare_global_plan  # StorageWriter
_.write_data  # StorageWriter
_.validate_checkpoint_id  # StorageWriter
is_coordinator  # StorageWriter.set_up_storage_writer's argument
checkpoint_id  # StorageWriter.reset's and validate_checkpoint_id's argument
domain  # pyzmq's ZAP credentials provider: callback(domain, key) (contract/curve.py)
_.curve_server  # zmq socket options, set as attributes (contract/curve.py)
_.curve_secretkey
_.curve_publickey
_.curve_serverkey
_.zap_domain
_.handshake_ivl
_.on_train_start  # Lightning's Callback hooks (integrations/lightning.py, tests' workers)
_.on_validation_start
_.on_validation_end
_.on_sanity_check_start
_.on_train_epoch_start
_.on_train_batch_start
pl_module  # Lightning's hook arguments
batch_idx
_.training_step  # LightningModule hooks (tests/helpers/lightning_worker.py)
_.configure_optimizers
_.train_dataloader
_.validation_step
_.val_dataloader
_.should_save  # transformers' TrainerControl flag (integrations/transformers.py)
_.forward  # torch.nn.Module (tests/helpers/straggler_worker.py)
_.waited_s  # an event's field: written to the history by its dataclass fields
_._split_scope  # pytest-xdist's LoadScopeScheduling hook (tests/helpers/phases.py)
exitstatus  # pytest's pytest_sessionfinish argument (tests/conftest.py)
_.exitstatus
_slot_map  # worker_sdk/runtime/runtime.py: held, the step slot is a view of its mapping
local_tz  # a fixture the tests ask for by name (tests/supervisor/record/test_history.py)
spin  # tests/helpers/trainer.py: the busy loop's counter
answer_call  # run by name in a fresh interpreter (tests/worker_sdk/runtime/test_epoch_resume.py)
