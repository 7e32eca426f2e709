"""`P2PNode`: a node's libp2p host (gossipsub and the status protocol) behind an asyncio-facing API.

The host, its services and every libp2p call live in one trio loop in one thread (p2p/bridge.py);
this class is used from asyncio. Its identity is the node's Ethereum key (p2p/identity.py), which
every connection proves through noise, the only security transport offered (p2p/security.py). Every
gossip message from another peer passes p2p/guard.py before it is delivered or forwarded, and the
node's own messages are signed with the same key, so its peers can check them the same way.

    node = P2PNode(account, domain)
    await node.start()
    await node.connect(other_listen_addr)
    async with await node.subscribe(checkpoints_topic(pool)) as announcements:
        await node.publish(checkpoints_topic(pool), Checkpoint(pool, step, manifest_hash))
        async for received in announcements: ...
    await node.stop()
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import multiaddr
import trio
from eth_account.signers.local import LocalAccount
from libp2p import new_host
from libp2p.abc import IHost, ISubscriptionAPI
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, PROTOCOL_ID_V12, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import Pubsub
from libp2p.request_response import RequestContext, RequestResponse, RequestResponseConfig, RequestResponseError
from libp2p.tools.anyio_service.context import background_trio_service

from core.metrics import Registry
from p2p.bridge import TrioThread
from p2p.config import P2PConfig
from p2p.errors import MessageError, NotRunningError, P2PError, PeerError
from p2p.guard import MessageGuard
from p2p.identity import address_of, key_pair_of, peer_id_of
from p2p.messages import TOPIC_PAYLOAD, Payload, SignedMessage, Topic, sign_message
from p2p.security import ForgeryReportingPubsub, security_options
from p2p.status import MAX_REQUEST_BYTES, STATUS_PROTOCOL, StatusCodec, StatusHandler
from p2p.subscription import Received, Subscription
from protocol.signing import SigningDomain

log = logging.getLogger("p2p")
GOSSIPSUB_PROTOCOLS = [PROTOCOL_ID_V12, PROTOCOL_ID_V11, PROTOCOL_ID]


@dataclass
class _Libp2p:
    """The libp2p objects; touched from the trio thread only."""

    host: IHost
    pubsub: Pubsub
    gossipsub: GossipSub
    requests: RequestResponse
    readers: dict[str, trio.CancelScope] = field(default_factory=dict)


def _check_port_free(host: str, port: int) -> None:
    """P2PError if `port` is taken. py-libp2p binds with SO_REUSEPORT, so a second host on a taken port would
    start and share it with the first, the kernel splitting connections between them; a plain bind fails."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise P2PError("cannot listen: the port is in use", host=host, port=port, error=str(exc)) from None


def _peer(peer_id: str) -> ID:
    try:
        address_of(peer_id)  # also checks it is a secp256k1 peer id, the only kind a prime node has
    except P2PError as exc:
        raise P2PError("not a prime peer id", peer_id=peer_id, error=str(exc)) from None
    return ID.from_base58(peer_id)


class P2PNode:
    """A libp2p host whose identity is `account`; messages are signed under `domain`. Start once, stop once."""

    def __init__(
        self,
        account: LocalAccount,
        domain: SigningDomain,
        config: P2PConfig | None = None,
        *,
        registry: Registry | None = None,
        status_handler: StatusHandler | None = None,
    ) -> None:
        self.account, self.domain = account, domain
        self.config = config or P2PConfig()
        self.metrics = registry if registry is not None else Registry()
        self.peer_id = peer_id_of(account)
        self.address: str = account.address
        self.status_handler = status_handler
        self.guard = MessageGuard(self.config, domain, self.metrics)
        self._own_id = ID.from_base58(self.peer_id)
        self._bridge = TrioThread(f"p2p-{self.peer_id[-6:]}", on_finished=self._end_subscriptions)
        self._libp2p: _Libp2p | None = None
        self._listen_addrs: tuple[str, ...] = ()
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._published = self.metrics.counter("p2p_messages_published_total", "Gossip messages published here.")
        self._delivered = self.metrics.counter("p2p_messages_delivered_total", "Gossip messages given to readers.")
        self._overflow = self.metrics.counter("p2p_subscription_overflow_total", "Messages a slow reader missed.")
        self._status = self.metrics.counter("p2p_status_requests_total", "Status requests answered, by outcome.")
        self.metrics.gauge("p2p_peers", "Connected peers.", self._peer_count)

    # lifecycle

    @property
    def listen_addrs(self) -> list[str]:
        """Full multiaddrs (`/ip4/127.0.0.1/tcp/PORT/p2p/PEER_ID`) other hosts can `connect` to."""
        return list(self._listen_addrs)

    async def start(self) -> None:
        """Starts the host; P2PError if it cannot listen (a fixed port in use) or does not start in time."""
        if self.config.listen_port != 0:
            _check_port_free(self.config.listen_host, self.config.listen_port)
        self._listen_addrs = await self._bridge.start(self._main, self.config.start_timeout_s)
        log.info("p2p host %s (%s) listening on %s", self.peer_id, self.address, ", ".join(self._listen_addrs))

    async def stop(self) -> None:
        await self._bridge.stop(self.config.stop_timeout_s)
        self._end_subscriptions()

    async def __aenter__(self) -> P2PNode:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # peers

    async def connect(self, addr: str) -> str:
        """Dials `addr` (a multiaddr ending in `/p2p/<peer id>`); returns the peer id. PeerError on failure."""
        try:
            info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        except Exception as exc:  # multiaddr raises several unrelated types for bad text
            raise P2PError("not a multiaddr ending in /p2p/<peer id>", addr=addr, error=str(exc)) from None
        peer = info.peer_id.to_base58()
        if peer == self.peer_id:
            raise P2PError("a host cannot connect to itself", addr=addr)
        if self.guard.is_banned(peer):
            raise PeerError("peer is banned", peer, addr=addr)

        async def dial() -> None:
            try:
                with trio.fail_after(self.config.connect_timeout_s):
                    await self._require().host.connect(info)
            except trio.TooSlowError:
                raise PeerError("connect timed out", peer, addr=addr, timeout_s=self.config.connect_timeout_s) from None
            except Exception as exc:
                raise PeerError("cannot connect", peer, addr=addr, error=repr(exc)) from exc

        await self._bridge.run(dial)
        return peer

    async def peers(self) -> list[str]:
        """Peer ids of the hosts connected now."""
        return await self._bridge.run(self._connected_peers)

    async def wait_for_topic_peers(self, topic: str, count: int, timeout: float) -> list[str]:
        """Waits until a message published on `topic` would go to at least `count` peers; returns them.

        A subscribed host sends to its gossipsub mesh, which the heartbeat fills; one that is not subscribed
        sends to peers it knows to be subscribed. Publishing before that reaches fewer peers, or none.
        """

        async def wait() -> list[str]:
            with trio.move_on_after(timeout):
                while len(peers := self._topic_peers(topic)) < count:
                    await trio.sleep(0.05)
                return peers
            raise P2PError("too few peers on topic", topic=topic, wanted=count, have=len(self._topic_peers(topic)))

        return await self._bridge.run(wait)

    async def request_status(self, peer_id: str) -> dict[str, Any]:
        """Asks a connected (or known) peer for its status over `/prime/status/1.0.0`. PeerError on failure."""
        target = _peer(peer_id)
        config = self._request_config()

        async def ask() -> dict[str, Any]:
            try:
                return await self._require().requests.send_request(target, [STATUS_PROTOCOL], {}, StatusCodec(), config)
            except RequestResponseError as exc:
                raise PeerError("status request failed", peer_id, error=f"{type(exc).__name__}: {exc}") from exc

        return await self._bridge.run(ask)

    # gossip

    async def subscribe(self, topic: str) -> Subscription:
        """A reader of the verified messages other peers publish on `topic` (own messages are not echoed)."""
        Topic.parse(topic)
        if not self._bridge.running:
            raise NotRunningError("p2p host is not running", peer_id=self.peer_id)
        subscription = Subscription(topic, self.config.subscription_buffer, self._unsubscribe, self._overflow)
        readers = self._subscriptions.setdefault(topic, set())
        readers.add(subscription)
        if len(readers) == 1:
            try:
                await self._bridge.run(functools.partial(self._open_topic, topic))
            except BaseException:
                subscription.end()
                await self._unsubscribe(subscription)
                raise
        return subscription

    async def publish(self, topic: str, payload: Payload) -> SignedMessage:
        """Signs `payload` with this node's key and publishes it on `topic`; returns what was sent.

        MessageError if the payload does not belong on the topic (type or pool) or encodes too large.
        """
        expected = Topic.parse(topic)
        if not isinstance(payload, TOPIC_PAYLOAD[expected.kind]) or payload.pool_id != expected.pool_id:
            raise MessageError(
                "payload does not belong on this topic", topic=topic, type=type(payload).__name__, pool=payload.pool_id
            )
        message = sign_message(payload, self.account, self.domain)
        data = message.encode()
        if len(data) > self.config.max_message_bytes:
            raise MessageError("message too large", topic=topic, size=len(data), limit=self.config.max_message_bytes)
        await self.publish_bytes(topic, data)
        return message

    async def publish_bytes(self, topic: str, data: bytes) -> None:
        """Publishes `data` as it is, without `publish`'s checks: for tools and tests that need raw traffic.

        Peers still drop whatever their guard refuses, and score this host down for it.
        """

        async def send() -> None:
            await self._require().pubsub.publish(topic, data)

        await self._bridge.run(send)
        self._published.inc()

    # trio side

    async def _main(self) -> None:
        listen = multiaddr.Multiaddr(f"/ip4/{self.config.listen_host}/tcp/{self.config.listen_port}")
        key_pair = key_pair_of(self.account)
        host = new_host(key_pair=key_pair, sec_opt=security_options(key_pair), listen_addrs=[listen])  # noise only
        gossipsub = GossipSub(
            GOSSIPSUB_PROTOCOLS,
            degree=6,
            degree_low=4,
            degree_high=12,
            heartbeat_interval=self.config.heartbeat_interval_s,
            spam_protection_enabled=False,  # per forwarder and topic, it throttles honest relaying; guard.py limits
        )
        pubsub = ForgeryReportingPubsub(host, gossipsub, self._forged)
        requests = RequestResponse(host)
        requests.set_handler(STATUS_PROTOCOL, self._serve_status, StatusCodec(), self._request_config())
        async with host.run([listen]), background_trio_service(pubsub), background_trio_service(gossipsub):
            if not host.get_addrs():  # py-libp2p logs a failed bind and carries on without a listener
                raise P2PError("could not listen", addr=str(listen))
            await pubsub.wait_until_ready()
            self._libp2p = _Libp2p(host, pubsub, gossipsub, requests)
            try:
                await self._bridge.serve(tuple(str(addr) for addr in host.get_addrs()))
            finally:
                self._libp2p = None

    def _require(self) -> _Libp2p:
        if self._libp2p is None:
            raise NotRunningError("p2p host is not running", peer_id=self.peer_id)
        return self._libp2p

    def _request_config(self) -> RequestResponseConfig:
        return RequestResponseConfig(
            timeout=self.config.request_timeout_s,
            max_request_size=MAX_REQUEST_BYTES,
            max_response_size=self.config.max_status_bytes,
            max_concurrent_inbound=self.config.max_inbound_requests,
        )

    async def _connected_peers(self) -> list[str]:
        return [peer.to_base58() for peer in self._require().host.get_connected_peers()]

    def _topic_peers(self, topic: str) -> list[str]:
        libp2p = self._require()
        peers = libp2p.gossipsub.mesh.get(topic) if topic in libp2p.pubsub.topic_ids else None
        if peers is None:
            peers = libp2p.pubsub.peer_topics.get(topic, set())
        return sorted(peer.to_base58() for peer in peers)

    async def _open_topic(self, topic: str) -> None:
        libp2p = self._require()
        libp2p.pubsub.set_topic_validator(topic, functools.partial(self._validate, topic), False)
        subscription = await libp2p.pubsub.subscribe(topic)
        scope = libp2p.readers[topic] = trio.CancelScope()
        self._bridge.start_soon(self._read_topic, topic, subscription, scope)

    async def _close_topic(self, topic: str) -> None:
        libp2p = self._require()
        scope = libp2p.readers.pop(topic, None)
        if scope is not None:
            scope.cancel()
        await libp2p.pubsub.unsubscribe(topic)
        libp2p.pubsub.remove_topic_validator(topic)

    def _validate(self, topic: str, forwarder: ID, msg: rpc_pb2.Message) -> bool:
        """gossipsub's topic validator: True delivers and forwards `msg`, False drops it. Never raises."""
        try:
            origin = ID(msg.from_id)
            if origin == self._own_id and forwarder == self._own_id:
                return True  # published here: `publish` built it (`publish_bytes` is the caller's choice)
            verdict = self.guard.inspect(topic, msg.data, origin.to_base58(), forwarder.to_base58())
            for peer in verdict.banned:
                self._ban(peer)
            return verdict.message is not None
        except Exception:
            log.exception("gossip validator failed on %s; dropping the message", topic)
            return False

    def _forged(self, forwarder: ID, msg: rpc_pb2.Message) -> None:
        """Pubsub's report of a message whose libp2p signature fails, before it drops it. Never raises."""
        try:
            verdict = self.guard.reject_forged(
                ",".join(msg.topicIDs), ID(msg.from_id).to_base58(), forwarder.to_base58()
            )
            for peer in verdict.banned:
                self._ban(peer)
        except Exception:
            log.exception("scoring a forged gossip message from %s failed", forwarder)

    def _ban(self, peer: str) -> None:
        libp2p = self._require()
        peer_id = ID.from_base58(peer)
        libp2p.pubsub.add_to_blacklist(peer_id)  # drops its gossip and closes its pubsub stream
        self._bridge.start_soon(self._disconnect, peer_id)

    async def _disconnect(self, peer_id: ID) -> None:
        try:
            await self._require().host.disconnect(peer_id)
        except Exception as exc:
            log.warning("could not disconnect banned peer %s: %r", peer_id, exc)

    async def _read_topic(self, topic: str, subscription: ISubscriptionAPI, scope: trio.CancelScope) -> None:
        with scope:
            async for msg in subscription:
                origin = ID(msg.from_id).to_base58()
                if origin == self.peer_id:
                    continue  # gossipsub hands a host its own messages too
                try:  # the guard accepted these bytes; decoding them again cannot fail but is cheap to check
                    received = Received(topic, SignedMessage.decode(msg.data), origin, address_of(origin))
                except P2PError as exc:
                    log.error("accepted message on %s from %s does not decode: %s", topic, origin, exc)
                    continue
                self._bridge.to_loop(self._dispatch, received)

    async def _serve_status(self, request: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        peer = context.peer_id.to_base58()
        handler = self.status_handler
        refusal = "peer is banned" if self.guard.is_banned(peer) else "no status handler" if handler is None else ""
        if refusal or handler is None:
            self._status.inc(outcome="refused")
            raise RequestResponseError(refusal)  # logged by py-libp2p; the requester sees its stream reset
        try:
            status = await self._bridge.call_asyncio(_call(handler, peer))
        except Exception as exc:
            self._status.inc(outcome="failed")
            log.warning("status handler failed for %s: %r", peer, exc)
            raise RequestResponseError("status handler failed") from exc
        self._status.inc(outcome="served")
        return dict(status)

    # asyncio side

    def _dispatch(self, received: Received) -> None:
        readers = self._subscriptions.get(received.topic)
        if readers:
            self._delivered.inc()
            for reader in list(readers):
                reader.offer(received)

    async def _unsubscribe(self, subscription: Subscription) -> None:
        readers = self._subscriptions.get(subscription.topic)
        if readers is None or subscription not in readers:
            return
        readers.discard(subscription)
        if not readers:
            del self._subscriptions[subscription.topic]
            if self._bridge.running:
                with contextlib.suppress(NotRunningError):
                    await self._bridge.run(functools.partial(self._close_topic, subscription.topic))

    def _end_subscriptions(self) -> None:
        for readers in self._subscriptions.values():
            for reader in readers:
                reader.end()
        self._subscriptions.clear()

    def _peer_count(self) -> float:
        libp2p = self._libp2p
        return float(len(libp2p.host.get_network().connections)) if libp2p is not None else 0.0


async def _call(handler: StatusHandler, peer: str) -> Mapping[str, Any]:
    return await handler(peer)
