//! Decide: validating a command and choosing its records (the leader's side), each applied live
//! through `apply` at once. Built on `apply`; nothing below calls it.

use super::*;

impl Partition {
    /// Appends a checkpoint of the state as it is now (after the records before it).
    pub(super) fn push_checkpoint(&mut self, now: u64, records: &mut Vec<Record>) {
        let offset = self.next_offset;
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Checkpoint(Box::new(Checkpoint {
                next_id: self.next_id,
                receive_seq: self.receive_seq,
                retention_ms: self.retention_ms,
                dedup_scope: self.dedup_scope,
                last_purge_ms: self.last_purge_ms,
                live_floor: self.live_floor().unwrap_or(offset),
                live_count: self.live_count(),
                groups: self.group_list(),
            })),
        };
        self.apply_live(&rec);
        records.push(rec);
    }

    /// DLQ moves started and not completed (after recovery: forward them again).
    pub fn pending_moves(&self) -> Vec<MoveStart> {
        self.moving
            .iter()
            .filter_map(|id| self.msgs.get(id).map(|m| self.move_request(*id, m)))
            .collect()
    }

    pub(super) fn move_request(&self, id: u64, m: &Msg) -> MoveStart {
        MoveStart {
            origin: MoveOrigin {
                queue_id: self.cfg.queue_id,
                partition: self.cfg.partition,
                msg_id: id,
                sent_ms: m.sent_ms,
            },
            message_id: m.message_id,
            sent_offset: m.sent_offset,
            destination: m.move_to,
            dead_letter_source: m.origin,
        }
    }

    /// Validates and decides `cmd` at `now_ms`, applies it in memory, and returns the records to
    /// make durable before the reply. On `Err` nothing was changed (timers aside).
    pub fn execute(&mut self, now_ms: u64, cmd: Command) -> Result<Effects, EngineError> {
        let first_offset = self.next_offset;
        let mut fx = self.decide(now_ms, cmd)?;
        fx.first_offset = first_offset;
        let interval = u64::from(self.cfg.limits.checkpoint_interval_records.max(1));
        if !fx.records.is_empty()
            && (self.last_checkpoint.is_none() || self.records_since_checkpoint >= interval)
            && self.checkpoint_fits()
        {
            let now = self.now_ms;
            self.push_checkpoint(now, &mut fx.records);
        }
        debug_assert_eq!(first_offset + fx.records.len() as u64, self.next_offset);
        Ok(fx)
    }

    /// A batch command: 1 to [`BATCH_ENTRIES_MAX`] entries, each decided on its own and in
    /// order by `one` (which pushes its records), one result per entry in `reply`.
    pub(super) fn batch<T>(
        &mut self,
        entries: Vec<T>,
        mut one: impl FnMut(&mut Self, T, &mut Vec<Record>) -> Result<(), EngineError>,
        reply: fn(Vec<Result<(), EngineError>>) -> Reply<Delivery>,
    ) -> Result<Effects, EngineError> {
        check_batch_len(entries.len())?;
        let mut records = Vec::with_capacity(entries.len());
        let results = entries
            .into_iter()
            .map(|e| one(self, e, &mut records))
            .collect();
        Ok(Effects::of(records, reply(results)))
    }

    pub(super) fn decide(&mut self, now_ms: u64, cmd: Command) -> Result<Effects, EngineError> {
        let now = self.advance(now_ms);
        match cmd {
            Command::Send(req) => {
                let mut records = Vec::with_capacity(1);
                let md5_body = md5_of_body(req.body.as_bytes());
                let reply = self.send(now, req, md5_body, &mut records)?;
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::Sent(reply),
                    moves: Vec::new(),
                })
            }
            Command::SendBatch(entries) => self.send_batch(now, entries),
            Command::Receive(req) => self.receive(now, req),
            Command::Delete { receipt } => {
                let mut records = Vec::with_capacity(1);
                self.delete(now, receipt, &mut records)?;
                Ok(Effects::of(records, Reply::Deleted))
            }
            Command::DeleteBatch(receipts) => self.batch(
                receipts,
                |p, r, records| p.delete(now, r, records),
                Reply::DeletedBatch,
            ),
            Command::ChangeVisibility { receipt, timeout_s } => {
                let mut records = Vec::with_capacity(1);
                self.change_visibility(now, receipt, timeout_s, &mut records)?;
                Ok(Effects::of(records, Reply::VisibilityChanged))
            }
            // Each entry as its own command would see it: a lease an earlier entry ended
            // (timeout 0) has expired by the next one.
            Command::ChangeVisibilityBatch(entries) => self.batch(
                entries,
                |p, (r, t), records| {
                    p.advance(now);
                    p.change_visibility(now, r, t, records)
                },
                Reply::VisibilityChangedBatch,
            ),
            Command::Purge => {
                if self
                    .last_purge_ms
                    .is_some_and(|t| now < t + PURGE_INTERVAL_MS)
                {
                    return Err(EngineError::PurgeQueueInProgress);
                }
                let rec = Record {
                    at_ms: now,
                    kind: RecordKind::Purged {
                        before_id: self.next_id,
                    },
                };
                self.apply_live(&rec);
                Ok(Effects {
                    first_offset: 0,
                    records: vec![rec],
                    reply: Reply::Purged,
                    moves: Vec::new(),
                })
            }
            Command::SetAttributes(attrs) => {
                if attrs.kind != self.cfg.attributes.kind {
                    return Err(EngineError::attr(
                        "FifoQueue",
                        "cannot change the queue kind",
                    ));
                }
                let mut records = Vec::new();
                if attrs.retention_ms() != self.retention_ms
                    || attrs.dedup_scope != self.dedup_scope
                {
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::Configured {
                            retention_s: attrs.retention_s,
                            dedup_scope: attrs.dedup_scope,
                        },
                    };
                    self.apply_live(&rec);
                    records.push(rec);
                }
                self.cfg.attributes = *attrs;
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::AttributesSet,
                    moves: Vec::new(),
                })
            }
            Command::AcceptMove(req) => self.accept_move(now, req),
            Command::StartMoves(req) => self.start_moves(now, req),
            Command::CompleteMove { msg_id } => {
                let mut records = Vec::new();
                if matches!(self.msgs.get(&msg_id), Some(m) if m.state == State::Moving) {
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::DlqMoveDone { id: msg_id },
                    };
                    self.apply_live(&rec);
                    records.push(rec);
                }
                Ok(Effects {
                    first_offset: 0,
                    records,
                    reply: Reply::MoveCompleted,
                    moves: Vec::new(),
                })
            }
        }
    }

    pub(super) fn validate_send(&self, req: &SendRequest) -> Result<(), EngineError> {
        validate_body(&req.body)?;
        let attrs_bytes = validate_message_attributes(&req.attributes)?;
        let size = req.body.len() + attrs_bytes;
        let size_max = self.cfg.attributes.message_size_bytes_max as usize;
        if size > size_max {
            return Err(EngineError::param(
                "MessageBody",
                format!("message must be shorter than {size_max} bytes"),
            ));
        }
        if let Some(d) = req.delay_s {
            if d > DELAY_S_MAX {
                return Err(EngineError::param("DelaySeconds", "must be 0 to 900"));
            }
        }
        if let Some(g) = &req.group_id {
            validate_token("MessageGroupId", g)?;
        }
        if let Some(d) = &req.dedup_id {
            validate_token("MessageDeduplicationId", d)?;
        }
        if self.fifo() {
            if req.group_id.is_none() {
                return Err(EngineError::param(
                    "MessageGroupId",
                    "is required for FIFO queues",
                ));
            }
            if req.delay_s.is_some_and(|d| d > 0) {
                return Err(EngineError::param(
                    "DelaySeconds",
                    "per-message delay is not valid for FIFO queues",
                ));
            }
            if req.dedup_id.is_none() && !self.cfg.attributes.content_based_dedup {
                return Err(EngineError::param(
                    "MessageDeduplicationId",
                    "the queue should either have ContentBasedDeduplication enabled or \
                     MessageDeduplicationId provided explicitly",
                ));
            }
        } else if req.dedup_id.is_some() {
            return Err(EngineError::param(
                "MessageDeduplicationId",
                "is only valid for FIFO queues",
            ));
        }
        Ok(())
    }

    /// `md5_body` is the body's digest, computed by the caller (a batch hashes its bodies
    /// together, up to sixteen at a time with AVX2, twelve without).
    pub(super) fn send(
        &mut self,
        now: u64,
        req: SendRequest,
        md5_body: Md5Digest,
        records: &mut Vec<Record>,
    ) -> Result<SentReply, EngineError> {
        self.validate_send(&req)?;
        let fifo = self.fifo();
        let dedup_id = match (&req.dedup_id, fifo) {
            (Some(d), true) => Some(d.clone()),
            (None, true) => Some(hex(&Sha256::digest(req.body.as_bytes()))),
            _ => None,
        };
        let visible_at_ms = if fifo {
            now + self.cfg.attributes.delay_ms()
        } else {
            now + req
                .delay_s
                .map_or(self.cfg.attributes.delay_ms(), |d| u64::from(d) * 1000)
        };
        let payload =
            Payload::with_md5_body(req.body, md5_body, req.attributes, req.group_id, dedup_id);
        if let Some(d) = &payload.dedup_id {
            let hash = self.dedup_hash(payload.group_id.as_deref(), d);
            if let Some(e) = self.dedup.get(hash) {
                return Ok(SentReply {
                    message_id: self.dedup_message_id(&e),
                    sequence_number: Some(e.seq),
                    md5_body: payload.md5_body(),
                    md5_attributes: payload.md5_attributes,
                    duplicate: true,
                });
            }
            let max = (self.cfg.limits.dedup_entries_max as usize).min(DEDUP_TABLE_MAX);
            if self.dedup.len() >= max {
                return Err(EngineError::OverLimit("deduplication table is full"));
            }
        }
        // A plain message needs no entry (it may wait in the tail), nor does a grouped one
        // visible at once (it waits in its group's list): only pinned ones count.
        let grouped = fifo || payload.group_id.is_some();
        let plain = !grouped && visible_at_ms <= now;
        let waits = grouped && visible_at_ms == now;
        if waits && self.grouped >= u64::from(self.cfg.limits.waiting_messages_max) {
            return Err(EngineError::OverLimit(
                "partition holds its maximum of waiting grouped messages",
            ));
        }
        self.check_capacity(!plain && !waits)?;
        let id = self.next_id;
        let reply = SentReply {
            message_id: MessageId::derive(self.cfg.queue_id, self.cfg.partition, id),
            sequence_number: fifo.then_some(id),
            md5_body: payload.md5_body(),
            md5_attributes: payload.md5_attributes,
            duplicate: false,
        };
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Sent(Sent {
                id,
                message_id: reply.message_id,
                visible_at_ms,
                payload: Arc::new(payload),
                origin: None,
                redriven: false,
            }),
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(reply)
    }

    /// Room for one more message entry. A message's size never counts here: its bytes are in
    /// the log, bounded by the disk (a full disk is the log's clear, retryable error).
    pub(super) fn check_capacity(&self, pinned: bool) -> Result<(), EngineError> {
        if pinned && self.pinned >= u64::from(self.cfg.limits.message_entries_max) {
            return Err(EngineError::OverLimit(
                "partition holds its maximum of messages",
            ));
        }
        if self.next_id >= MSG_ID_MAX {
            return Err(EngineError::OverLimit("partition message ids exhausted"));
        }
        Ok(())
    }

    pub(super) fn send_batch(
        &mut self,
        now: u64,
        entries: Vec<BatchEntry>,
    ) -> Result<Effects, EngineError> {
        validate_batch(&entries)?;
        let mut records = Vec::with_capacity(entries.len());
        let mut results = Vec::with_capacity(entries.len());
        let bodies: Vec<&[u8]> = entries.iter().map(|e| e.request.body.as_bytes()).collect();
        let digests = md5_of_bodies(&bodies);
        for (e, md5_body) in entries.into_iter().zip(digests) {
            let r = self.send(now, e.request, md5_body, &mut records);
            results.push((e.id, r));
        }
        Ok(Effects {
            first_offset: 0,
            records,
            reply: Reply::SentBatch(results),
            moves: Vec::new(),
        })
    }

    pub(super) fn delivered(&self, id: u64, m: &Msg) -> Delivery {
        Delivery {
            receipt: Receipt {
                queue_id: self.cfg.queue_id,
                partition: self.cfg.partition,
                msg_id: id,
                epoch: m.receive_count,
            },
            message_id: m.message_id,
            sent_offset: m.sent_offset,
            sent_ms: m.sent_ms,
            receive_count: m.receive_count,
            first_receive_ms: m.first_receive_ms.unwrap_or(0),
            sequence_number: self.fifo().then_some(id),
            dead_letter_source: m.origin,
        }
    }

    pub(super) fn receive(
        &mut self,
        now: u64,
        req: ReceiveRequest,
    ) -> Result<Effects, EngineError> {
        if req.max_messages == 0 || req.max_messages > RECEIVE_MESSAGES_MAX {
            return Err(EngineError::param("MaxNumberOfMessages", "must be 1 to 10"));
        }
        if req
            .visibility_timeout_s
            .is_some_and(|v| v > VISIBILITY_TIMEOUT_S_MAX)
        {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "must be 0 to 43200",
            ));
        }
        if let Some(a) = &req.attempt_id {
            validate_token("ReceiveRequestAttemptId", a)?;
        }
        let fifo = self.fifo();
        let vt_ms = req
            .visibility_timeout_s
            .map_or(self.cfg.attributes.visibility_timeout_ms(), |v| {
                u64::from(v) * 1000
            });
        let attempt = if fifo { req.attempt_id } else { None };
        if let Some(a) = &attempt {
            if let Some(effects) = self.retry_attempt(now, a, vt_ms) {
                return Ok(effects);
            }
        }
        let inflight_max = u64::from(self.cfg.limits.inflight_max);
        if self.counters.in_flight >= inflight_max {
            if fifo {
                return Ok(Effects::reply(Reply::Received(Vec::new())));
            }
            return Err(EngineError::OverLimit("too many messages in flight"));
        }
        let max_rc = self
            .cfg
            .attributes
            .redrive_policy
            .as_ref()
            .map(|p| p.max_receive_count);
        let max = req.max_messages as usize;
        let mut fx = Effects::reply(Reply::None);
        let mut out = Vec::with_capacity(max);
        let mut moves = 0u32;
        'outer: while out.len() < max && self.counters.in_flight < inflight_max {
            let Some(&(_, head, _)) = self.ready.first() else {
                break;
            };
            let mut id = head;
            loop {
                // A waiting head has never been received (receive count 0); its `Received`
                // gives it its entry.
                let receive_count = self.msgs.get(&id).map_or(0, |m| m.receive_count);
                let at_limit = max_rc.is_some_and(|rc| receive_count >= rc);
                if at_limit {
                    if id != head {
                        // FIFO: a later message of the group is due for the DLQ; it moves when
                        // it is the head of an idle group, so order holds.
                        break;
                    }
                    if moves >= self.cfg.limits.dlq_moves_per_receive_max {
                        break 'outer;
                    }
                    moves += 1;
                    let rec = Record {
                        at_ms: now,
                        kind: RecordKind::DlqMoveStarted {
                            id,
                            destination: MoveDestination::RedriveTarget,
                        },
                    };
                    self.apply_live(&rec);
                    let m = self.msgs.get(&id).expect("moving message is present");
                    fx.moves.push(self.move_request(id, m));
                    fx.records.push(rec);
                    continue 'outer;
                }
                let rec = Record {
                    at_ms: now,
                    kind: RecordKind::Received {
                        id,
                        receive_count: receive_count + 1,
                        deadline_ms: now + vt_ms,
                        attempt_id: attempt.clone(),
                        batch_start: out.is_empty(),
                    },
                };
                self.apply_live(&rec);
                fx.records.push(rec);
                let m = self.msgs.get(&id).expect("received message is present");
                out.push(self.delivered(id, m));
                if !fifo || out.len() >= max || self.counters.in_flight >= inflight_max {
                    continue 'outer;
                }
                // FIFO: keep taking this group's next messages in order while they are visible.
                let group = self.groups[m.group as usize]
                    .as_ref()
                    .expect("message's group exists");
                let member = group.members.range(id + 1..).next().copied();
                let waiting = group.waiting.front.map(|w| w.id);
                match member.into_iter().chain(waiting).min() {
                    Some(next)
                        if self.msgs.get(&next).map_or(State::Available, |n| n.state)
                            == State::Available =>
                    {
                        id = next;
                        let rc = self.msgs.get(&next).map_or(0, |n| n.receive_count);
                        if max_rc.is_some_and(|max| rc >= max) {
                            continue 'outer;
                        }
                    }
                    _ => continue 'outer,
                }
            }
        }
        fx.reply = Reply::Received(out);
        Ok(fx)
    }

    /// A FIFO ReceiveRequestAttemptId retry: the same messages and handles if none of them was
    /// deleted, re-received or had its visibility changed, with the visibility timeout reset.
    pub(super) fn retry_attempt(&mut self, now: u64, attempt: &str, vt_ms: u64) -> Option<Effects> {
        let entry = self.attempts.get(attempt)?;
        let valid = entry.items.iter().all(|&(id, epoch)| {
            self.msgs.get(&id).is_some_and(|m| {
                m.receive_count == epoch && !m.touched && matches!(m.state, State::InFlight { .. })
            })
        });
        if !valid {
            return None;
        }
        let items = entry.items.clone();
        let mut fx = Effects::reply(Reply::None);
        let mut out = Vec::with_capacity(items.len());
        for (id, epoch) in items {
            let m = self.msgs.get(&id).expect("validated above");
            let State::InFlight { lease_start_ms, .. } = m.state else {
                unreachable!("validated above")
            };
            let rec = Record {
                at_ms: now,
                kind: RecordKind::VisibilityChanged {
                    id,
                    epoch,
                    deadline_ms: (now + vt_ms).min(lease_start_ms + LEASE_MS_MAX),
                    attempt_retry: true,
                },
            };
            self.apply_live(&rec);
            fx.records.push(rec);
            let m = self.msgs.get(&id).expect("validated above");
            out.push(self.delivered(id, m));
        }
        fx.reply = Reply::Received(out);
        Some(fx)
    }

    pub(super) fn check_receipt(&self, r: &Receipt) -> Result<(), EngineError> {
        if r.queue_id != self.cfg.queue_id || r.partition != self.cfg.partition {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "issued for another partition",
            ));
        }
        if r.msg_id >= self.next_id || r.epoch == 0 {
            return Err(EngineError::ReceiptHandleIsInvalid("no such message"));
        }
        Ok(())
    }

    /// Deletes the message `r` leases, its `Deleted` record pushed onto `records`.
    pub(super) fn delete(
        &mut self,
        now: u64,
        r: Receipt,
        records: &mut Vec<Record>,
    ) -> Result<(), EngineError> {
        self.check_receipt(&r)?;
        let Some(m) = self.msgs.get(&r.msg_id) else {
            // Already deleted, expired or purged: SQS treats a repeated delete as success.
            return Ok(());
        };
        if m.state == State::Moving {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the message is being moved to another queue",
            ));
        }
        if r.epoch > m.receive_count {
            return Err(EngineError::ReceiptHandleIsInvalid("no such lease"));
        }
        if self.fifo() && (r.epoch != m.receive_count || !matches!(m.state, State::InFlight { .. }))
        {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the lease of this receipt handle has expired",
            ));
        }
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Deleted { id: r.msg_id },
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(())
    }

    pub(super) fn change_visibility(
        &mut self,
        now: u64,
        r: Receipt,
        timeout_s: u32,
        records: &mut Vec<Record>,
    ) -> Result<(), EngineError> {
        if timeout_s > VISIBILITY_TIMEOUT_S_MAX {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "must be 0 to 43200",
            ));
        }
        self.check_receipt(&r)?;
        let Some(m) = self.msgs.get(&r.msg_id) else {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "the message no longer exists",
            ));
        };
        if r.epoch != m.receive_count {
            return Err(EngineError::ReceiptHandleIsInvalid(
                "a newer receive holds the message",
            ));
        }
        let State::InFlight { lease_start_ms, .. } = m.state else {
            return Err(EngineError::MessageNotInflight);
        };
        let deadline_ms = now + u64::from(timeout_s) * 1000;
        if deadline_ms > lease_start_ms + LEASE_MS_MAX {
            return Err(EngineError::param(
                "VisibilityTimeout",
                "exceeds 12 hours from the receive",
            ));
        }
        let rec = Record {
            at_ms: now,
            kind: RecordKind::VisibilityChanged {
                id: r.msg_id,
                epoch: r.epoch,
                deadline_ms,
                attempt_retry: false,
            },
        };
        self.apply_live(&rec);
        records.push(rec);
        Ok(())
    }

    /// One redrive step: see [`StartMoves`]. Looks at messages in id order (that is send order)
    /// from `from_id`; a message moves if it is visible (not delayed, in flight or already
    /// moving), on a FIFO queue is the head of its group with nothing of the group in flight
    /// (so a group leaves in order), and has a destination.
    pub(super) fn start_moves(
        &mut self,
        now: u64,
        req: StartMoves,
    ) -> Result<Effects, EngineError> {
        if req.max_messages == 0 || req.max_messages > MOVES_PER_COMMAND_MAX {
            return Err(EngineError::param(
                "MaxNumberOfMessagesPerSecond",
                format!("must be 1 to {MOVES_PER_COMMAND_MAX}"),
            ));
        }
        match req.destination {
            MoveDestination::RedriveTarget => {
                return Err(EngineError::param(
                    "DestinationArn",
                    "a redrive goes to the dead-letter source or to a named queue",
                ))
            }
            MoveDestination::Queue(q) if q == self.cfg.queue_id => {
                return Err(EngineError::param(
                    "DestinationArn",
                    "the destination must differ from the source queue",
                ))
            }
            _ => {}
        }
        let fifo = self.fifo();
        // The scan below looks at entries in id order: waiting messages get theirs first (a
        // redrive is rare; the records it makes give replay the same entries, see
        // `give_entry`).
        self.promote_all();
        let mut fx = Effects::reply(Reply::None);
        let mut out = MovesStarted {
            started: 0,
            skipped_no_destination: 0,
            next_from_id: None,
        };
        let mut cursor = req.from_id;
        let mut scanned = 0u32;
        // Messages waiting in the tail are looked at once loaded: the scan stops where the
        // tail begins and the reply's cursor points there (the shard loads before each step).
        let limit = self.tail.as_ref().map_or(u64::MAX, |t| t.first_id);
        while let Some((&id, m)) = self.msgs.range(cursor..limit.max(cursor)).next() {
            if out.started >= req.max_messages || scanned >= MOVE_SCAN_PER_COMMAND_MAX {
                out.next_from_id = Some(id);
                break;
            }
            scanned += 1;
            cursor = id + 1;
            if m.state != State::Available {
                continue;
            }
            if fifo {
                let grp = self.groups[m.group as usize]
                    .as_ref()
                    .expect("message's group exists");
                if grp.inflight > 0 || grp.members.first() != Some(&id) {
                    continue;
                }
            }
            if req.destination == MoveDestination::DeadLetterSource && m.origin.is_none() {
                out.skipped_no_destination += 1;
                continue;
            }
            let rec = Record {
                at_ms: now,
                kind: RecordKind::DlqMoveStarted {
                    id,
                    destination: req.destination,
                },
            };
            self.apply_live(&rec);
            let m = self.msgs.get(&id).expect("moving message is present");
            fx.moves.push(self.move_request(id, m));
            fx.records.push(rec);
            out.started += 1;
        }
        if out.next_from_id.is_none() && self.tail.is_some() {
            out.next_from_id = Some(limit.max(cursor));
        }
        fx.reply = Reply::MovesStarted(out);
        Ok(fx)
    }

    /// Destination side of a move. A dead-letter move keeps the message's history that SQS
    /// keeps (original send time for retention, the dead-letter source); a redrive makes a
    /// fresh message (receive count 0, retention from now, no dead-letter source), keeping its
    /// MessageId and content. Either way the origin is remembered for idempotency.
    pub(super) fn accept_move(
        &mut self,
        now: u64,
        req: MoveRequest,
    ) -> Result<Effects, EngineError> {
        let o = req.origin;
        if self
            .origins
            .contains_key(&(o.queue_id, o.partition, o.msg_id))
        {
            return Ok(Effects::reply(Reply::MoveAccepted));
        }
        if self.fifo() && req.payload.group_id.is_none() {
            return Err(EngineError::param(
                "MessageGroupId",
                "a FIFO dead-letter queue needs messages with a group",
            ));
        }
        if self.origins.len() >= self.cfg.limits.move_origins_max as usize {
            return Err(EngineError::OverLimit("too many recent dead-letter moves"));
        }
        self.check_capacity(true)?;
        let rec = Record {
            at_ms: now,
            kind: RecordKind::Sent(Sent {
                id: self.next_id,
                message_id: req.message_id,
                visible_at_ms: now,
                payload: req.payload,
                origin: Some(o),
                redriven: req.destination.is_redrive(),
            }),
        };
        self.apply_live(&rec);
        Ok(Effects {
            first_offset: 0,
            records: vec![rec],
            reply: Reply::MoveAccepted,
            moves: Vec::new(),
        })
    }
}

/// A batch request holds 1 to [`BATCH_ENTRIES_MAX`] entries.
fn check_batch_len(n: usize) -> Result<(), EngineError> {
    match n {
        0 => Err(EngineError::EmptyBatchRequest),
        n if n > BATCH_ENTRIES_MAX => Err(EngineError::TooManyEntriesInBatchRequest),
        _ => Ok(()),
    }
}

/// SendMessageBatch's request-level rules: 1–10 entries, ids of 1–80 alphanumerics, `-`, `_`,
/// distinct, and at most 1 MiB of messages in total. Entry-level problems are per-entry results.
pub fn validate_batch(entries: &[BatchEntry]) -> Result<(), EngineError> {
    check_batch_len(entries.len())?;
    let mut total = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if e.id.is_empty()
            || e.id.len() > BATCH_ENTRY_ID_LEN_MAX
            || !e
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(EngineError::InvalidBatchEntryId(e.id.clone()));
        }
        if entries[..i].iter().any(|p| p.id == e.id) {
            return Err(EngineError::BatchEntryIdsNotDistinct(e.id.clone()));
        }
        total += e.request.body.len()
            + e.request
                .attributes
                .iter()
                .map(MessageAttribute::size_bytes)
                .sum::<usize>();
    }
    if total > BATCH_PAYLOAD_BYTES_MAX {
        return Err(EngineError::BatchRequestTooLong { size_bytes: total });
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}
