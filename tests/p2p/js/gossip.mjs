// A second gossipsub implementation for tests/node/p2p/test_js_gossip.py: js-libp2p with @chainsafe/libp2p-gossipsub
// dials one multiaddr, joins one topic, publishes one message once the remote is in its mesh, and waits for one
// message from the mesh. It prints one JSON line:
// {"peerId", "remotePeer", "published": [peer ids], "received": {"from", "data" (hex), "type"} or null}, or with
// "error" if something failed on the way.
//
//   node gossip.mjs MULTIADDR TOPIC SECP256K1_KEY_HEX PAYLOAD_HEX [sign|nosign] [WAIT_MS]
//
// The key is the host's identity (a worker's Ethereum key: the same secp256k1 secret, as node/p2p/identity.py does).
// With `nosign` its messages go out unsigned and without an author (gossipsub's StrictNoSign). WAIT_MS (10000) bounds
// each wait.
// Exit status 0 whenever it could answer; anything else means the script itself failed.
import './node20.mjs'
import { gossipsub } from '@chainsafe/libp2p-gossipsub'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { privateKeyFromRaw } from '@libp2p/crypto/keys'
import { identify } from '@libp2p/identify'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'

const [addr, topic, keyHex, payloadHex, signing = 'sign', wait = '10000'] = process.argv.slice(2)
const TIMEOUT_MS = Number(wait)
if (payloadHex === undefined || !['sign', 'nosign'].includes(signing) || !(TIMEOUT_MS > 0)) {
  console.error('usage: node gossip.mjs MULTIADDR TOPIC SECP256K1_KEY_HEX PAYLOAD_HEX [sign|nosign] [WAIT_MS]')
  process.exit(2)
}

const node = await createLibp2p({
  privateKey: privateKeyFromRaw(Buffer.from(keyHex, 'hex')),
  addresses: { listen: [] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    pubsub: gossipsub({ globalSignaturePolicy: signing === 'sign' ? 'StrictSign' : 'StrictNoSign' })
  }
})
const pubsub = node.services.pubsub
const received = new Promise((resolve) => {
  pubsub.addEventListener('message', ({ detail }) => {
    resolve({ from: detail.from?.toString() ?? null, data: Buffer.from(detail.data).toString('hex'), type: detail.type })
  })
})

async function until (condition, what) {
  const deadline = Date.now() + TIMEOUT_MS
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

const result = { peerId: node.peerId.toString() }
try {
  const connection = await node.dial(multiaddr(addr), { signal: AbortSignal.timeout(TIMEOUT_MS) })
  result.remotePeer = connection.remotePeer.toString()
  pubsub.subscribe(topic)
  await until(() => pubsub.getMeshPeers(topic).includes(result.remotePeer), 'the remote in the mesh')
  result.published = (await pubsub.publish(topic, Buffer.from(payloadHex, 'hex'))).recipients.map(String)
  result.received = await Promise.race([received, new Promise((resolve) => setTimeout(() => resolve(null), TIMEOUT_MS))])
} catch (error) {
  result.error = `${error.name}: ${error.message}`
}
console.log(JSON.stringify(result))
await node.stop()
process.exit(0)
