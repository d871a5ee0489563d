//! Message move tasks (SQS StartMessageMoveTask / ListMessageMoveTasks /
//! CancelMessageMoveTask): redrive from a dead-letter queue back to the queues its messages
//! came from, or to a named queue, at a bounded rate.
//!
//! Tasks live on shard 0 (every front end forwards there), at most one active per source queue,
//! the 10 most recent kept per source. A task walks each partition of the source with the
//! engine's `StartMoves` step (at most [`MOVES_PER_COMMAND_MAX`] messages, rate-limited); each
//! started move is durable in the source partition (`DlqMoveStarted`) and goes out through the
//! same two-step protocol as a dead-letter move (`forward_move`: `AcceptMove` at the
//! destination, then `CompleteMove` at the source), so a message is in exactly one of the two
//! queues whatever crashes when. After a broker restart the moves already started complete; the
//! task itself (its progress counters) is not durable and is not resumed: list shows no task,
//! and the operator starts a new one, which moves what is left.

use super::{Shard, ShardRequest, ShardResponse};
use crate::engine::partition::MOVES_PER_COMMAND_MAX;
use crate::engine::record::MoveDestination;
use crate::engine::{Command, EngineError, Reply, StartMoves};
use crate::error::{ServiceError, ServiceResult};
use crate::metadata::QueueMeta;
use crate::runtime;
use base64::Engine as _;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// SQS's upper bound of MaxNumberOfMessagesPerSecond.
pub const MOVE_RATE_MAX: u32 = 500;
/// The rate of a task that names none ("system optimized" in SQS): bounded all the same, so a
/// redrive of a deep DLQ cannot starve the partitions' other work.
pub const MOVE_RATE_DEFAULT: u32 = 500;
/// Tasks remembered per source queue (ListMessageMoveTasks returns at most 10).
pub const TASKS_KEPT_PER_QUEUE: usize = 10;
/// A step that fails transiently (shard busy, storage hiccup) is retried this many times.
const STEP_RETRIES: u32 = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveTaskStatus {
    Running,
    Completed,
    Cancelling,
    Cancelled,
    Failed,
}

impl MoveTaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveTaskStatus::Running => "RUNNING",
            MoveTaskStatus::Completed => "COMPLETED",
            MoveTaskStatus::Cancelling => "CANCELLING",
            MoveTaskStatus::Cancelled => "CANCELLED",
            MoveTaskStatus::Failed => "FAILED",
        }
    }

    fn active(self) -> bool {
        matches!(self, MoveTaskStatus::Running | MoveTaskStatus::Cancelling)
    }
}

/// One task as ListMessageMoveTasks shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveTaskInfo {
    /// Only for a running task (as SQS does).
    pub task_handle: Option<String>,
    pub status: MoveTaskStatus,
    pub source_arn: String,
    pub destination_arn: Option<String>,
    pub max_messages_per_second: Option<u32>,
    pub messages_moved: u64,
    pub messages_to_move: u64,
    pub failure_reason: Option<String>,
    pub started_ms: u64,
}

#[derive(Debug)]
pub enum MoveTaskOp {
    Start {
        tenant: String,
        source_arn: String,
        destination_arn: Option<String>,
        max_messages_per_second: Option<u32>,
    },
    List {
        tenant: String,
        source_arn: String,
        max_results: u32,
    },
    Cancel {
        tenant: String,
        task_handle: String,
    },
}

#[derive(Debug)]
pub enum MoveTaskReply {
    Started(String),
    Listed(Vec<MoveTaskInfo>),
    Cancelled(u64),
}

/// A task's state, shared between the registry and its runner.
#[derive(Debug)]
pub(super) struct Task {
    id: u64,
    source_id: u64,
    handle: String,
    source_arn: String,
    destination_arn: Option<String>,
    destination: MoveDestination,
    rate: Option<u32>,
    started_ms: u64,
    to_move: Cell<u64>,
    moved: Cell<u64>,
    status: Cell<MoveTaskStatus>,
    failure: RefCell<Option<String>>,
}

impl Task {
    fn info(&self) -> MoveTaskInfo {
        let status = self.status.get();
        MoveTaskInfo {
            task_handle: (status == MoveTaskStatus::Running).then(|| self.handle.clone()),
            status,
            source_arn: self.source_arn.clone(),
            destination_arn: self.destination_arn.clone(),
            max_messages_per_second: self.rate,
            messages_moved: self.moved.get(),
            messages_to_move: self.to_move.get(),
            failure_reason: self.failure.borrow().clone(),
            started_ms: self.started_ms,
        }
    }
}

/// Shard 0's registry: per source queue, its most recent tasks (oldest first).
#[derive(Debug, Default)]
pub(super) struct MoveTasks {
    next_id: u64,
    by_source: HashMap<u64, Vec<Rc<Task>>>,
}

fn encode_handle(source_id: u64, task_id: u64) -> String {
    base64::engine::general_purpose::STANDARD
        .encode(format!("sluice-move-v1:{source_id}:{task_id}"))
}

fn decode_handle(handle: &str) -> Option<(u64, u64)> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(handle)
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let mut it = text.strip_prefix("sluice-move-v1:")?.split(':');
    let source = it.next()?.parse().ok()?;
    let task = it.next()?.parse().ok()?;
    it.next().is_none().then_some((source, task))
}

fn not_found(what: &str) -> ServiceError {
    ServiceError::ResourceNotFound(format!("{what} does not exist or is not accessible"))
}

impl Shard {
    /// StartMessageMoveTask: returns the task handle.
    pub async fn start_move_task(
        &self,
        tenant: &str,
        source_arn: &str,
        destination_arn: Option<&str>,
        max_messages_per_second: Option<u32>,
    ) -> ServiceResult<String> {
        let op = MoveTaskOp::Start {
            tenant: tenant.to_string(),
            source_arn: source_arn.to_string(),
            destination_arn: destination_arn.map(str::to_string),
            max_messages_per_second,
        };
        match self.move_task_request(op).await? {
            MoveTaskReply::Started(h) => Ok(h),
            other => Err(ServiceError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// ListMessageMoveTasks: the most recent tasks of a source queue, newest first.
    pub async fn list_move_tasks(
        &self,
        tenant: &str,
        source_arn: &str,
        max_results: u32,
    ) -> ServiceResult<Vec<MoveTaskInfo>> {
        let op = MoveTaskOp::List {
            tenant: tenant.to_string(),
            source_arn: source_arn.to_string(),
            max_results,
        };
        match self.move_task_request(op).await? {
            MoveTaskReply::Listed(l) => Ok(l),
            other => Err(ServiceError::Internal(format!("unexpected {other:?}"))),
        }
    }

    /// CancelMessageMoveTask: returns the messages moved so far.
    pub async fn cancel_move_task(&self, tenant: &str, task_handle: &str) -> ServiceResult<u64> {
        let op = MoveTaskOp::Cancel {
            tenant: tenant.to_string(),
            task_handle: task_handle.to_string(),
        };
        match self.move_task_request(op).await? {
            MoveTaskReply::Cancelled(n) => Ok(n),
            other => Err(ServiceError::Internal(format!("unexpected {other:?}"))),
        }
    }

    async fn move_task_request(&self, op: MoveTaskOp) -> ServiceResult<MoveTaskReply> {
        self.check_ready()?;
        match self.request(0, ShardRequest::MoveTask(op)).await {
            ShardResponse::MoveTask(r) => r,
            ShardResponse::Reply(Err(e)) => Err(e),
            other => Err(ServiceError::Internal(format!("unexpected {other:?}"))),
        }
    }

    fn tenant_queue_by_arn(&self, tenant: &str, arn: &str) -> ServiceResult<Arc<QueueMeta>> {
        self.catalog
            .borrow()
            .lookup_arn(arn)
            .filter(|q| q.tenant == tenant)
            .ok_or_else(|| not_found(&format!("queue {arn}")))
    }

    /// On shard 0.
    pub(super) async fn move_task_op(&self, op: MoveTaskOp) -> ServiceResult<MoveTaskReply> {
        match op {
            MoveTaskOp::Start {
                tenant,
                source_arn,
                destination_arn,
                max_messages_per_second,
            } => {
                let src = self.tenant_queue_by_arn(&tenant, &source_arn)?;
                if self.dead_letter_sources(&src).is_empty() {
                    return Err(EngineError::param(
                        "SourceArn",
                        "the source queue must be configured as a dead-letter queue of another queue",
                    )
                    .into());
                }
                if let Some(r) = max_messages_per_second {
                    if r == 0 || r > MOVE_RATE_MAX {
                        return Err(EngineError::param(
                            "MaxNumberOfMessagesPerSecond",
                            "must be 1 to 500",
                        )
                        .into());
                    }
                }
                let destination = match &destination_arn {
                    None => MoveDestination::DeadLetterSource,
                    Some(arn) => {
                        let d = self.tenant_queue_by_arn(&tenant, arn)?;
                        if d.id == src.id {
                            return Err(EngineError::param(
                                "DestinationArn",
                                "the destination must not be the source queue",
                            )
                            .into());
                        }
                        MoveDestination::Queue(d.id)
                    }
                };
                if self
                    .move_tasks
                    .borrow()
                    .by_source
                    .get(&src.id)
                    .is_some_and(|l| l.iter().any(|t| t.status.get().active()))
                {
                    return Err(ServiceError::Unsupported(format!(
                        "a message move task is already running on {source_arn}"
                    )));
                }
                let counters = self.queue_counters(&src).await?;
                let task = {
                    let mut tasks = self.move_tasks.borrow_mut();
                    tasks.next_id += 1;
                    let id = tasks.next_id;
                    let task = Rc::new(Task {
                        id,
                        source_id: src.id,
                        handle: encode_handle(src.id, id),
                        source_arn: source_arn.clone(),
                        destination_arn,
                        destination,
                        rate: max_messages_per_second,
                        started_ms: runtime::now_ms(),
                        to_move: Cell::new(counters.visible),
                        moved: Cell::new(0),
                        status: Cell::new(MoveTaskStatus::Running),
                        failure: RefCell::new(None),
                    });
                    let list = tasks.by_source.entry(src.id).or_default();
                    list.push(task.clone());
                    if list.len() > TASKS_KEPT_PER_QUEUE {
                        list.remove(0);
                    }
                    task
                };
                tracing::info!(
                    source = %source_arn,
                    task = task.id,
                    "message move task started"
                );
                let me = self.this.upgrade().expect("shard alive while serving");
                runtime::spawn(me.run_move_task(task.clone(), src));
                Ok(MoveTaskReply::Started(task.handle.clone()))
            }
            MoveTaskOp::List {
                tenant,
                source_arn,
                max_results,
            } => {
                let src = self.tenant_queue_by_arn(&tenant, &source_arn)?;
                let tasks = self.move_tasks.borrow();
                let list = tasks
                    .by_source
                    .get(&src.id)
                    .map(|l| {
                        l.iter()
                            .rev()
                            .take(max_results as usize)
                            .map(|t| t.info())
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(MoveTaskReply::Listed(list))
            }
            MoveTaskOp::Cancel {
                tenant,
                task_handle,
            } => {
                let (source_id, task_id) =
                    decode_handle(&task_handle).ok_or_else(|| not_found("the task"))?;
                let task = {
                    let tasks = self.move_tasks.borrow();
                    tasks
                        .by_source
                        .get(&source_id)
                        .and_then(|l| l.iter().find(|t| t.id == task_id).cloned())
                };
                let task = task.ok_or_else(|| not_found("the task"))?;
                let owned = self
                    .catalog
                    .borrow()
                    .get(task.source_id)
                    .is_some_and(|q| q.tenant == tenant);
                if !owned {
                    return Err(not_found("the task"));
                }
                if task.status.get() != MoveTaskStatus::Running {
                    return Err(ServiceError::Unsupported(format!(
                        "only a RUNNING task can be cancelled; this one is {}",
                        task.status.get().as_str()
                    )));
                }
                task.status.set(MoveTaskStatus::Cancelling);
                Ok(MoveTaskReply::Cancelled(task.moved.get()))
            }
        }
    }

    /// Walks every partition of the source with `StartMoves` steps until each scan reaches the
    /// end, the task is cancelled, or a step fails for good.
    async fn run_move_task(self: Rc<Self>, task: Rc<Task>, src: Arc<QueueMeta>) {
        let rate = task.rate.unwrap_or(MOVE_RATE_DEFAULT);
        let step_max = rate.min(MOVES_PER_COMMAND_MAX);
        let mut outcome: Result<(), String> = Ok(());
        'partitions: for p in 0..src.partitions {
            let mut from_id = 0;
            let mut failures = 0;
            loop {
                if task.status.get() == MoveTaskStatus::Cancelling {
                    break 'partitions;
                }
                let cmd = Command::StartMoves(StartMoves {
                    max_messages: step_max,
                    destination: task.destination,
                    from_id,
                });
                let begun = runtime::now_ms();
                match self.execute_on(&src, p, cmd).await {
                    Ok(Reply::MovesStarted(m)) => {
                        failures = 0;
                        task.moved.set(task.moved.get() + u64::from(m.started));
                        if task.moved.get() > task.to_move.get() {
                            task.to_move.set(task.moved.get());
                        }
                        // Pace: `started` messages take started/rate seconds.
                        let budget_ms = u64::from(m.started) * 1000 / u64::from(rate);
                        let spent = runtime::now_ms().saturating_sub(begun);
                        if budget_ms > spent {
                            runtime::sleep(Duration::from_millis(budget_ms - spent)).await;
                        }
                        match m.next_from_id {
                            Some(n) => from_id = n,
                            None => break,
                        }
                    }
                    Ok(other) => {
                        outcome = Err(format!("unexpected reply {other:?}"));
                        break 'partitions;
                    }
                    Err(ServiceError::NonExistentQueue) => {
                        outcome = Err("the source queue was deleted".to_string());
                        break 'partitions;
                    }
                    Err(e @ ServiceError::Engine(_)) => {
                        outcome = Err(e.to_string());
                        break 'partitions;
                    }
                    Err(e) => {
                        failures += 1;
                        if failures > STEP_RETRIES {
                            outcome = Err(e.to_string());
                            break 'partitions;
                        }
                        tracing::warn!(error = %e, task = task.id, "move task step failed; retrying");
                        runtime::sleep(Duration::from_millis(100 << failures.min(6))).await;
                    }
                }
            }
        }
        let status = match outcome {
            Err(reason) => {
                *task.failure.borrow_mut() = Some(reason);
                MoveTaskStatus::Failed
            }
            Ok(()) if task.status.get() == MoveTaskStatus::Cancelling => MoveTaskStatus::Cancelled,
            Ok(()) => MoveTaskStatus::Completed,
        };
        task.status.set(status);
        tracing::info!(
            task = task.id,
            status = status.as_str(),
            moved = task.moved.get(),
            "message move task finished"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let h = encode_handle(7, 42);
        assert_eq!(decode_handle(&h), Some((7, 42)));
        for bad in ["", "!!!", "c2x1aWNl", &encode_handle(7, 42)[..8]] {
            assert_eq!(decode_handle(bad), None, "{bad}");
        }
        let extra = base64::engine::general_purpose::STANDARD.encode("sluice-move-v1:1:2:3");
        assert_eq!(decode_handle(&extra), None);
    }
}
