/* amqp_dl.h: librabbitmq (rabbitmq-c), loaded the first time it is needed
 * (dl.h says why).  Debian 12 ships 0.11 (librabbitmq4).
 *
 * conn/amqp.c, librabbitmq's only caller, includes this header instead of
 * <amqp.h> and calls ik_amqp_load() before any amqp_* function.
 */
#ifndef IK_AMQP_DL_H
#define IK_AMQP_DL_H

#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "dl/dl.h"

#ifndef IK_LIBRABBITMQ
#define IK_LIBRABBITMQ "librabbitmq.so.4"
#endif
#ifndef IK_LIBRABBITMQ_DEB
#define IK_LIBRABBITMQ_DEB "librabbitmq4"
#endif

#define IK_AMQP_FUNCS(X) \
	X(amqp_new_connection) X(amqp_destroy_connection) X(amqp_tcp_socket_new) \
	X(amqp_ssl_socket_new) X(amqp_ssl_socket_set_cacert) X(amqp_ssl_socket_set_key) \
	X(amqp_ssl_socket_set_verify_peer) X(amqp_ssl_socket_set_verify_hostname) \
	X(amqp_socket_open_noblock) X(amqp_login) X(amqp_channel_open) \
	X(amqp_get_rpc_reply) X(amqp_queue_declare) X(amqp_confirm_select) \
	X(amqp_basic_publish) X(amqp_simple_wait_frame_noblock) X(amqp_basic_get) \
	X(amqp_read_message) X(amqp_destroy_message) X(amqp_basic_ack) \
	X(amqp_basic_reject) X(amqp_connection_close) X(amqp_error_string2) \
	X(amqp_get_sockfd) X(amqp_maybe_release_buffers) X(amqp_set_rpc_timeout) \
	X(amqp_set_handshake_timeout) X(amqp_frames_enqueued) X(amqp_data_in_buffer) \
	X(amqp_send_method)

struct ik_amqp_api {
	IK_AMQP_FUNCS(IK_DL_FIELD)
};
extern struct ik_amqp_api ik_amqpl;

/* IK_OK, or IK_CONFIG when librabbitmq or one of its functions is missing. */
int ik_amqp_load(ik_err *err);

#ifndef IK_AMQP_DL_IMPL  /* amqp_dl.c names the symbols themselves */
#define amqp_new_connection            (ik_amqpl.amqp_new_connection)
#define amqp_destroy_connection        (ik_amqpl.amqp_destroy_connection)
#define amqp_tcp_socket_new            (ik_amqpl.amqp_tcp_socket_new)
#define amqp_ssl_socket_new            (ik_amqpl.amqp_ssl_socket_new)
#define amqp_ssl_socket_set_cacert     (ik_amqpl.amqp_ssl_socket_set_cacert)
#define amqp_ssl_socket_set_key        (ik_amqpl.amqp_ssl_socket_set_key)
#define amqp_ssl_socket_set_verify_peer (ik_amqpl.amqp_ssl_socket_set_verify_peer)
#define amqp_ssl_socket_set_verify_hostname (ik_amqpl.amqp_ssl_socket_set_verify_hostname)
#define amqp_socket_open_noblock       (ik_amqpl.amqp_socket_open_noblock)
#define amqp_login                     (ik_amqpl.amqp_login)
#define amqp_channel_open              (ik_amqpl.amqp_channel_open)
#define amqp_get_rpc_reply             (ik_amqpl.amqp_get_rpc_reply)
#define amqp_queue_declare             (ik_amqpl.amqp_queue_declare)
#define amqp_confirm_select            (ik_amqpl.amqp_confirm_select)
#define amqp_basic_publish             (ik_amqpl.amqp_basic_publish)
#define amqp_simple_wait_frame_noblock (ik_amqpl.amqp_simple_wait_frame_noblock)
#define amqp_basic_get                 (ik_amqpl.amqp_basic_get)
#define amqp_read_message              (ik_amqpl.amqp_read_message)
#define amqp_destroy_message           (ik_amqpl.amqp_destroy_message)
#define amqp_basic_ack                 (ik_amqpl.amqp_basic_ack)
#define amqp_basic_reject              (ik_amqpl.amqp_basic_reject)
#define amqp_connection_close          (ik_amqpl.amqp_connection_close)
#define amqp_error_string2             (ik_amqpl.amqp_error_string2)
#define amqp_get_sockfd                (ik_amqpl.amqp_get_sockfd)
#define amqp_maybe_release_buffers     (ik_amqpl.amqp_maybe_release_buffers)
#define amqp_set_rpc_timeout           (ik_amqpl.amqp_set_rpc_timeout)
#define amqp_set_handshake_timeout     (ik_amqpl.amqp_set_handshake_timeout)
#define amqp_frames_enqueued           (ik_amqpl.amqp_frames_enqueued)
#define amqp_data_in_buffer            (ik_amqpl.amqp_data_in_buffer)
#define amqp_send_method               (ik_amqpl.amqp_send_method)
#endif

#endif
