#include "registry.hpp"
int main() {
  return 0;
}
