#include "engine/evacuation/etcd_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <charconv>
#include <mutex>

#include <fmt/format.h>

namespace gpumigrate::evacuation {

std::string Base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Unbase64(const std::string& in) {
  if (in.size() % 4 != 0) return Corrupt("etcd: a base64 value of " + std::to_string(in.size()) + " characters");
  std::string out(in.size() / 4 * 3 + 1, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return Corrupt("etcd: a value is not base64");
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding's bytes as data.
  if (!in.empty() && in.back() == '=') --len;
  if (in.size() >= 2 && in[in.size() - 2] == '=') --len;
  out.resize(len);
  return out;
}

namespace {

// "the next key after every key that starts with p": etcd's range_end of a prefix.
std::string PrefixEnd(std::string p) {
  while (!p.empty()) {
    if (static_cast<unsigned char>(p.back()) < 0xff) {
      ++p.back();
      return p;
    }
    p.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// proto3 JSON: int64 as a string; absent when 0. -1 when it is neither.
int64_t Int(const J& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string()) return -1;
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() ? v : -1;
}

std::string Str(const J& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

size_t Collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

}  // namespace

EtcdClient::EtcdClient(std::string endpoint, std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  GlobalInit();
}

Result<J> EtcdClient::Post(const std::string& path, const J& body) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return Internal("etcd: curl_easy_init failed");
  const std::string url = endpoint_ + path;
  const std::string text = Dump(body);
  std::string reply;
  char error[CURL_ERROR_SIZE] = "";
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(text.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, std::min<long>(3000, static_cast<long>(timeout_.count())));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");  // etcd is reached directly, whatever http_proxy says
  const CURLcode rc = curl_easy_perform(curl);
  long http = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return Unavailable(fmt::format("etcd at {}: {}", endpoint_, error[0] ? error : curl_easy_strerror(rc)));
  }
  J j = J::parse(reply, nullptr, false);
  if (http != 200) {
    std::string why = j.is_object() ? Str(j, "error") : "";
    if (why.empty()) why = reply.substr(0, 200);
    const std::string m = fmt::format("etcd at {}: {} answered HTTP {}: {}", endpoint_, path, http, why);
    // A request etcd refuses (4xx: too many operations, a bad key) fails the
    // same way again: not worth retrying, unlike an etcd that is away.
    return http >= 400 && http < 500 ? Status(StatusCode::kInvalidArgument, m) : Unavailable(m);
  }
  if (j.is_discarded() || !j.is_object()) return Corrupt(fmt::format("etcd at {}: {} did not answer JSON", endpoint_, path));
  return j;
}

Result<std::vector<KeyValue>> EtcdClient::Get(const std::string& key, bool prefix) {
  J body = {{"key", Base64(key)}};
  if (prefix) body["range_end"] = Base64(PrefixEnd(key));
  GM_ASSIGN_OR_RETURN(J j, Post("/v3/kv/range", body));
  std::vector<KeyValue> out;
  if (!j.contains("kvs")) return out;
  if (!j["kvs"].is_array()) return Corrupt(fmt::format("etcd at {}: \"kvs\" is not a list", endpoint_));
  for (const auto& kv : j["kvs"]) {
    if (!kv.is_object()) return Corrupt(fmt::format("etcd at {}: a key-value is not an object", endpoint_));
    KeyValue x;
    GM_ASSIGN_OR_RETURN(x.key, Unbase64(Str(kv, "key")));
    GM_ASSIGN_OR_RETURN(x.value, Unbase64(Str(kv, "value")));
    x.create_revision = Int(kv, "create_revision");
    x.mod_revision = Int(kv, "mod_revision");
    if (x.create_revision < 0 || x.mod_revision < 0) {
      return Corrupt(fmt::format("etcd at {}: key {}: a revision is not a number", endpoint_, x.key));
    }
    out.push_back(std::move(x));
  }
  return out;
}

void EtcdClient::Txn::IfAbsent(const std::string& key) {
  compare.push_back({{"key", Base64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}});
}

void EtcdClient::Txn::IfModRevision(const std::string& key, int64_t rev) {
  compare.push_back(
      {{"key", Base64(key)}, {"target", "MOD"}, {"result", "EQUAL"}, {"mod_revision", std::to_string(rev)}});
}

void EtcdClient::Txn::IfValue(const std::string& key, const std::string& value) {
  compare.push_back({{"key", Base64(key)}, {"target", "VALUE"}, {"result", "EQUAL"}, {"value", Base64(value)}});
}

void EtcdClient::Txn::Put(const std::string& key, const std::string& value) {
  success.push_back({{"requestPut", {{"key", Base64(key)}, {"value", Base64(value)}}}});
}

void EtcdClient::Txn::Delete(const std::string& key) {
  success.push_back({{"requestDeleteRange", {{"key", Base64(key)}}}});
}

Result<bool> EtcdClient::Commit(const Txn& txn) {
  GM_ASSIGN_OR_RETURN(J j, Post("/v3/kv/txn", J{{"compare", txn.compare}, {"success", txn.success}}));
  auto it = j.find("succeeded");
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace gpumigrate::evacuation
