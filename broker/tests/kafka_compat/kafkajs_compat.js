// kafkajs against sluiced, run by test_compression.py (node, with NODE_PATH at the packages
// ci/install-deps.sh puts under target/node-kafka):
//   node kafkajs_compat.js <bootstrap> <user> <password> <topic> <group>
// Sends rounds of five messages with every codec, plain sends between compressed ones, then
// reads the topic back with a kafkajs consumer group; prints {"sent": [...], "got": [...]}.
//
// Codecs: gzip is built into kafkajs; snappy is kafkajs-snappy (snappyjs, pure JS); lz4 and
// zstd are registered here over lz4js (pure JS, LZ4 frames) and @bokuweb/zstd-wasm
// (WebAssembly): their usual kafkajs packages are native addons (kafkajs-lz4 needs the `lz4`
// addon, @kafkajs/zstd downloads a prebuilt binary).
const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require("kafkajs");
const SnappyCodec = require("kafkajs-snappy");
const lz4 = require("lz4js");
const zstd = require("@bokuweb/zstd-wasm");

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec;
CompressionCodecs[CompressionTypes.LZ4] = () => ({
  compress: async (encoder) => Buffer.from(lz4.compress(encoder.buffer)),
  decompress: async (buffer) => Buffer.from(lz4.decompress(buffer)),
});
// zstd-wasm is initialised once, in main(): a second `init()` after use leaves its
// compressor writing zeros (seen with 0.0.27: every frame after the first was all zeros,
// which sluiced rightly refused as CORRUPT_MESSAGE).
CompressionCodecs[CompressionTypes.ZSTD] = () => ({
  compress: async (encoder) => Buffer.from(zstd.compress(encoder.buffer, 3)),
  decompress: async (buffer) => Buffer.from(zstd.decompress(buffer)),
});

const CODECS = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
};
const ROUNDS = 2;
const PER_SEND = 5;
const CONSUME_TIMEOUT_MS = 40000;

async function main() {
  const [bootstrap, username, password, topic, group] = process.argv.slice(2);
  await zstd.init();
  const kafka = new Kafka({
    clientId: "sluice-kafkajs-compat",
    brokers: [bootstrap],
    sasl: { mechanism: "plain", username, password },
    logLevel: logLevel.ERROR,
  });
  const producer = kafka.producer();
  await producer.connect();
  const sent = [];
  for (let round = 0; round < ROUNDS; round++) {
    // Plain and compressed sends alternate on one producer (and one connection).
    for (const [name, compression] of Object.entries(CODECS)) {
      const messages = [];
      for (let j = 0; j < PER_SEND; j++) {
        messages.push({
          key: `k${j}`,
          value: `kafkajs ${name} round ${round} #${j} ` + "text ".repeat(60),
          headers: { codec: name },
        });
      }
      await producer.send({ topic, compression, acks: -1, messages });
      sent.push(...messages.map((m) => m.value));
    }
  }
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: group });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`read ${got.length} of ${sent.length} in time`)),
      CONSUME_TIMEOUT_MS,
    );
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push({
          value: message.value.toString(),
          key: message.key.toString(),
          codec: message.headers.codec.toString(),
        });
        if (got.length >= sent.length) {
          clearTimeout(timer);
          resolve();
        }
      },
    });
  });
  await consumer.disconnect();
  console.log(JSON.stringify({ sent, got }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
