//! Starting and stopping the broker: one glommio executor per shard, joined by a channel mesh.

use crate::config::BrokerConfig;
use crate::shard::{Envelope, Shard, MESH_CHANNEL_CAPACITY};
use futures::channel::mpsc;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::Placement;
use std::rc::Rc;
use std::sync::Arc;

/// Work handed to a shard from outside its thread (tests, the CLI's embedded mode).
pub type Job = Box<dyn FnOnce(Rc<Shard>) -> LocalBoxFuture<'static, ()> + Send>;

enum Control {
    Run(Job),
    Shutdown,
}

/// How long `BrokerHandle::wait_ready` waits for every shard (recovery of big logs included).
pub const SHARD_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A running broker: one thread per shard.
pub struct BrokerHandle {
    controls: Vec<mpsc::UnboundedSender<Control>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    ready: std::sync::Mutex<std::sync::mpsc::Receiver<Result<usize, String>>>,
    /// Holds the QUIC ports picked at start (`quic_addr` port 0, the per-shard endpoints)
    /// until every shard has bound its own.
    quic_port_reservation: std::sync::Mutex<Vec<std::net::UdpSocket>>,
    /// Holds the HTTP API's port the same way (`crate::http::reserve_port`).
    http_port_reservation: std::sync::Mutex<Option<socket2::Socket>>,
    /// And the Kafka listener's.
    kafka_port_reservation: std::sync::Mutex<Option<socket2::Socket>>,
    /// Every address this broker serves, claimed until it stops (`crate::ports::lock`).
    _port_locks: Vec<crate::ports::PortLock>,
    pub config: Arc<BrokerConfig>,
}

impl BrokerHandle {
    /// Waits until every shard has started (or one failed). A shard that cannot start (an
    /// executor refused by the memlock limit, say) can leave the others waiting for it in the
    /// mesh forever; so the wait is bounded and reports which shards never came up.
    pub fn wait_ready(&self) -> Result<(), String> {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = crate::runtime::monotonic_now() + SHARD_START_TIMEOUT;
        let mut started = 0;
        while started < self.controls.len() {
            let left = deadline.saturating_duration_since(crate::runtime::monotonic_now());
            match ready.recv_timeout(left) {
                Ok(r) => {
                    r?;
                    started += 1;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{} of {} shards did not start within {:?} (see the log; a common \
                         cause is the memlock limit: glommio locks memory per executor)",
                        self.controls.len() - started,
                        self.controls.len(),
                        SHARD_START_TIMEOUT
                    ))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("a shard exited during start-up".to_string())
                }
            }
        }
        // Every shard's endpoint is in the SO_REUSEPORT group now; the placeholder leaves it.
        self.quic_port_reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.http_port_reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.kafka_port_reservation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        Ok(())
    }

    /// The address the SQS HTTP API listens on (the real port when configured as 0).
    pub fn http_addr(&self) -> std::net::SocketAddr {
        self.config.http_addr
    }

    /// The address the Kafka protocol listens on, if on (the real port when configured as 0).
    pub fn kafka_addr(&self) -> Option<std::net::SocketAddr> {
        self.config.kafka_addr
    }

    /// The address the native QUIC protocol listens on (the real port when configured as 0).
    pub fn quic_addr(&self) -> std::net::SocketAddr {
        self.config.quic_addr
    }

    /// Runs `f` on shard `shard` and returns its result.
    pub fn run_on<T, F, Fut>(&self, shard: usize, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Job = Box::new(move |s| {
            Box::pin(async move {
                let _ = tx.send(f(s).await);
            })
        });
        self.controls[shard]
            .unbounded_send(Control::Run(job))
            .expect("shard running");
        rx.recv().expect("shard ran the job")
    }

    /// Stops every shard (partitions closed, staged writes committed) and joins the threads.
    pub fn shutdown(self) {
        for c in &self.controls {
            let _ = c.unbounded_send(Control::Shutdown);
        }
        for t in self.threads {
            let _ = t.join();
        }
        // The shards' state is freed: hand it back now (a process that goes on, such as one that
        // runs the broker again, would otherwise hold it until it allocates again).
        crate::memory::release_freed_memory();
    }
}

/// Starts the broker's shards, each on its own thread and executor.
pub fn start(mut config: BrokerConfig) -> std::io::Result<BrokerHandle> {
    if config.quic_enabled {
        crate::native::prepare(&config)?;
    }
    crate::kafka::tls::prepare(&config)?;
    let mut quic_port_reservation = Vec::new();
    let mut port_locks = Vec::new();
    // Reserved whatever the port: port 0 is resolved here, and a port another broker holds
    // fails the start instead of being shared with it.
    if config.quic_enabled {
        let (socket, addr, claimed) = crate::native::reserve_port(config.quic_addr)?;
        config.quic_addr = addr;
        quic_port_reservation.push(socket);
        port_locks.extend(claimed);
    }
    config.quic_shard_addrs.clear();
    if let (true, Some(base)) = (config.quic_enabled, config.quic_shard_port_base) {
        for i in 0..config.shards.max(1) {
            let port = if base == 0 {
                0
            } else {
                u16::try_from(usize::from(base) + i).map_err(|_| {
                    std::io::Error::other(format!("QUIC shard port {base} + {i} exceeds 65535"))
                })?
            };
            let want = std::net::SocketAddr::new(config.quic_addr.ip(), port);
            let (socket, addr, claimed) = crate::native::reserve_port(want)?;
            config.quic_shard_addrs.push(addr);
            quic_port_reservation.push(socket);
            port_locks.extend(claimed);
        }
    }
    if config.http_connections_per_shard_max.is_none() {
        // Fit the connection caps to the descriptors this process may open (crate::config_fds).
        let soft = crate::config_fds::nofile_soft_limit()?;
        let partitions = crate::config_fds::partitions_on_disk(&config.data_dir);
        let per_shard =
            crate::config_fds::connections_per_shard(soft, config.shards.max(1), partitions);
        tracing::info!(
            nofile_soft_limit = soft,
            queue_partitions = partitions,
            http_connections_per_shard = per_shard,
            shards = config.shards.max(1),
            "HTTP connection caps sized to the file descriptor limit (the rest is kept for \
             segment files, 2 per queue partition, and listeners)"
        );
        config.http_connections_per_shard_max = Some(per_shard);
        // Grown at once to the limit (crate::config_fds::presize_fd_table).
        if let Err(e) = crate::config_fds::presize_fd_table(soft) {
            tracing::warn!(error = %e, "growing the descriptor table at start");
        }
    }
    let (http_socket, http_addr, claimed) = crate::http::reserve_port(config.http_addr)?;
    config.http_addr = http_addr;
    port_locks.extend(claimed);
    let kafka_socket = match config.kafka_addr {
        Some(addr) => {
            let (socket, bound, claimed) =
                crate::http::reserve_tcp_port(addr, "Kafka listener (--kafka-addr)")?;
            config.kafka_addr = Some(bound);
            port_locks.extend(claimed);
            Some(socket)
        }
        None => None,
    };
    if let Some(cluster) = &config.cluster {
        // Each shard binds its own peer port without SO_REUSEPORT; a node killed a moment ago
        // may still hold its ports, so wait for them like for the others, and claim them.
        for shard in 0..config.shards.max(1) {
            let Some(addr) = crate::cluster::config::shard_addr(cluster.peer_addr, shard)
                .filter(|a| a.port() != 0)
            else {
                continue;
            };
            let context = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("cluster peer port {addr}: {e}"))
            };
            crate::ports::probe(addr, crate::ports::Transport::Udp).map_err(context)?;
            port_locks
                .extend(crate::ports::lock(addr, crate::ports::Transport::Udp).map_err(context)?);
        }
    }
    let started = crate::runtime::monotonic_now();
    // Bound before the shards start, so that port 0 is resolved in the shared config.
    let mut metrics_listener = crate::metrics::serve::bind(config.metrics_addr);
    if let Some(addr) = metrics_listener.as_ref().and_then(|l| l.local_addr().ok()) {
        config.metrics_addr = addr;
    }
    let config = Arc::new(config);
    let n = config.shards.max(1);
    let readiness = crate::metrics::serve::Readiness {
        started,
        shards_ready: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        shards: n,
    };
    let mesh = (n > 1).then(|| MeshBuilder::<Envelope, _>::full(n, MESH_CHANNEL_CAPACITY));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let mut controls = Vec::new();
    let mut threads = Vec::new();
    for id in 0..n {
        let (ctl_tx, mut ctl_rx) = mpsc::unbounded::<Control>();
        controls.push(ctl_tx);
        let config = config.clone();
        let mesh = mesh.clone();
        let ready_tx = ready_tx.clone();
        let readiness = readiness.clone();
        let metrics_listener = if id == 0 {
            metrics_listener.take()
        } else {
            None
        };
        let placement = match config.cpus.get(id % config.cpus.len().max(1)) {
            Some(cpu) if !config.cpus.is_empty() => Placement::Fixed(*cpu),
            _ => Placement::Unbound,
        };
        let builder = sluice_storage::rt::executor_builder(&format!("shard-{id}"), placement)
            .spin_before_park(config.spin_before_park());
        let handle = builder
            .spawn(move || async move {
                let joined = match mesh {
                    Some(m) => match m.join().await {
                        Ok(j) => Some(j),
                        Err(_) => {
                            let _ = ready_tx.send(Err(format!("shard {id}: mesh join failed")));
                            return;
                        }
                    },
                    None => None,
                };
                // Before the shard: what it starts may replicate (crate::cluster::node::local).
                if let Err(e) = crate::cluster::node::start(id, &config) {
                    let _ = ready_tx.send(Err(format!("shard {id}: cluster peer transport: {e}")));
                    return;
                }
                let shard = match Shard::start(id, config, joined).await {
                    Ok(s) => s,
                    Err(e) => {
                        crate::cluster::node::stop().await;
                        let _ = ready_tx.send(Err(format!("shard {id}: {e}")));
                        return;
                    }
                };
                // Shard 0 bootstraps the others; wait until this one has its catalog.
                while !shard.is_ready() {
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                }
                // FRONT ENDS START HERE: each shard serves its own listeners (SO_REUSEPORT).
                // Kept, not detached: at shutdown they are cancelled, which drops (closes) the
                // listeners. A detached task outlives its executor with its socket open, and a
                // broker started again in the same process would join that dead listener's
                // SO_REUSEPORT group (or, with the port probe, fail to start).
                let http = glommio::spawn_local(crate::http::serve(shard.clone()));
                let native = crate::native::NativeFrontEnd::start(shard.clone());
                let kafka = crate::kafka::KafkaFrontEnd::start(shard.clone());
                let metrics = metrics_listener.map(|l| {
                    let serve = crate::metrics::serve::serve(shard.clone(), l, readiness.clone());
                    glommio::spawn_local(serve)
                });
                readiness
                    .shards_ready
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                tracing::info!(shard = id, "shard ready");
                let _ = ready_tx.send(Ok(id));
                while let Some(c) = ctl_rx.next().await {
                    match c {
                        Control::Run(job) => {
                            glommio::spawn_local(job(shard.clone())).detach();
                        }
                        Control::Shutdown => break,
                    }
                }
                http.cancel().await;
                if let Some(m) = metrics {
                    m.cancel().await;
                }
                if let Some(native) = native {
                    native.shutdown().await;
                }
                if let Some(kafka) = kafka {
                    kafka.shutdown().await;
                }
                shard.shutdown().await;
                crate::cluster::node::stop().await;
                tracing::info!(shard = id, "shard stopped");
            })
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        threads.push(std::thread::spawn(move || {
            if let Err(e) = handle.join() {
                tracing::error!(error = %e, "shard thread failed");
            }
        }));
    }
    Ok(BrokerHandle {
        controls,
        threads,
        ready: std::sync::Mutex::new(ready),
        quic_port_reservation: std::sync::Mutex::new(quic_port_reservation),
        http_port_reservation: std::sync::Mutex::new(Some(http_socket)),
        kafka_port_reservation: std::sync::Mutex::new(kafka_socket),
        _port_locks: port_locks,
        config,
    })
}
